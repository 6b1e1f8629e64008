"""Gateways as separate processes (``python -m bow_gateway``) sharing one Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

import aiohttp

from . import PASSWORD, SECRET
from .redis_server import free_port
from .served import BOW_GATEWAY


def gateway_env(redis_url: str | None, namespace: str, **extra: str) -> dict[str, str]:
    """This environment without BOW_ variables, plus the settings of the gateway under test."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("BOW_")}
    env.update(
        BOW_NAMESPACE=namespace,
        BOW_JWT_SECRET=SECRET,
        BOW_INBOUND_PASSWORD=PASSWORD,
        BOW_BACKPLANE_PUBLISH_TIMEOUT="1",
    )
    if redis_url is not None:
        env["BOW_REDIS_URL"] = redis_url
    env.update(extra)
    return env


class Gateway:
    """``python -m bow_gateway serve --port P ARGS``, its stdout and stderr in ``log``."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._out: IO[bytes] = open(log, "wb")  # closed by stop() or kill()
        self.process = subprocess.Popen(
            [*BOW_GATEWAY, "serve", "--port", str(self.port), *args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_healthy(self, timeout: float = 20) -> None:
        """Block until ``GET /health`` answers 200 (for fixtures, before any event loop)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"serve exited with {self.process.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise AssertionError(f"{self.url}/health never answered 200:\n{self.tail()}")

    def tail(self) -> str:
        return self.output()[-3000:]

    def stop(self, timeout: float = 10) -> int:
        """SIGTERM, then the exit status (SIGKILL, the whole group, if it does not stop)."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        finally:
            self._out.close()

    def kill(self) -> None:
        """SIGKILL the process and every child it started (workers), then reap it."""
        for pid in children(self.process.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._out.close()


def children(pid: int) -> list[int]:
    """The pids of the live processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after it.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


async def health(http: aiohttp.ClientSession, url: str) -> int:
    try:
        async with http.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as response:
            return response.status
    except (aiohttp.ClientError, TimeoutError):
        return 0
