"""``bow-gateway serve`` as a real process for the tests that watch what the CLI writes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# The console script users run, beside this Python: unlike `python -m bow_gateway` started in
# the repository's root, it never imports the tree's bow_gateway/.
BOW_GATEWAY = (str(Path(sys.executable).with_name("bow-gateway")),)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any BOW_ variable, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("BOW_")}
    env.update(extra)
    return env


def wait_for_health(url: str, process: subprocess.Popen[bytes], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"serve exited with {process.returncode}"
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url}/health never answered")


async def send_raw(port: int, data: bytes) -> None:
    """Send ``data`` on a new connection and read until the gateway closes it or 1 s passes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        async with asyncio.timeout(1):
            while await reader.read(65536):
                pass
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()


@dataclass
class Served:
    """A running ``serve``: its address, its process, and the file its stderr goes to."""

    url: str
    port: int
    process: subprocess.Popen[bytes]
    stderr: Path
    _read: int = 0

    def new_stderr(self) -> str:
        """What serve wrote to stderr since the last call."""
        data = self.stderr.read_bytes()
        text, self._read = data[self._read :].decode(errors="replace"), len(data)
        return text

    def stop(self) -> int:
        """SIGTERM, then its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(15)


@contextlib.contextmanager
def serve(folder: Path, *args: str, **env: str) -> Iterator[Served]:
    """``bow-gateway serve --port P ARGS`` on a free port, stdout and stderr to files in
    ``folder``, until /health answers; stopped at the end."""
    port = free_port()
    stderr = folder / f"serve-{port}.stderr"
    with (
        open(folder / f"serve-{port}.stdout", "wb") as out,
        open(stderr, "wb") as err,
        subprocess.Popen(
            [*BOW_GATEWAY, "serve", "--port", str(port), *args],
            stdout=out,
            stderr=err,
            env=clean_env(**env),
        ) as process,
    ):
        served = Served(f"http://127.0.0.1:{port}", port, process, stderr)
        try:
            deadline = time.monotonic() + 20
            while True:
                assert process.poll() is None, stderr.read_text()
                try:
                    with urllib.request.urlopen(served.url + "/health", timeout=1):
                        break
                except (urllib.error.URLError, OSError):
                    assert time.monotonic() < deadline, "serve never answered /health"
                    time.sleep(0.1)
            yield served
        finally:
            served.stop()
