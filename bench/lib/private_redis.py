"""A private, throw-away redis-server for the benchmarks (never the shared one on port 6379).

``RedisServer()`` picks a free port, starts ``redis-server --port <free> --save '' --appendonly no``
bound to 127.0.0.1, waits until it answers ``PING`` and ``stop()`` shuts it down (SIGTERM, then
SIGKILL). Use it as a context manager. ``RedisServer(aof=True)`` persists instead, as a production
Redis would: ``--appendonly yes --appendfsync everysec`` in a temporary directory of its own
(``--dir``), removed by ``stop()``.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

SHARED_PORT = 6379


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now (never 6379)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port != SHARED_PORT:
            return port


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process of our own, without persistence (``aof``: with an AOF)."""

    def __init__(self, cpu: int | None = None, aof: bool = False) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not on PATH")
        self.aof = aof
        self.dir = tempfile.mkdtemp(prefix="bench-redis-") if aof else None
        persistence = ["--appendonly", "no"]
        if self.dir is not None:
            persistence = ["--appendonly", "yes", "--appendfsync", "everysec", "--dir", self.dir]
        for _ in range(5):  # another process may take the free port before redis-server binds it
            self.port = free_port()
            command = [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                *persistence,
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ]
            if cpu is not None and shutil.which("taskset"):
                command = ["taskset", "-c", str(cpu), *command]
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
            )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.process.poll() is None:
                if _ping(self.port):
                    self.pid = self.process.pid
                    self.url = f"redis://127.0.0.1:{self.port}/0"
                    return
                time.sleep(0.05)
            self._halt()
        self.stop()
        raise SystemExit("could not start a private redis-server")

    def stop(self) -> None:
        self._halt()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _halt(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def flush(self) -> None:
        """FLUSHALL, so that one configuration does not inherit the streams of the last."""
        with contextlib.closing(socket.create_connection(("127.0.0.1", self.port), 5)) as c:
            c.sendall(b"FLUSHALL\r\n")
            c.recv(64)

    def version(self) -> str:
        out = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout
        for word in out.split():
            if word.startswith("v="):
                return word[2:]
        return out.strip()

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
