"""A private ``redis-server`` for the tests: its own free port and directory, never the shared one.

with RedisServer(appendonly=True) as server:   # started; stopped and removed at the end
    backplane = RedisBackplane(server.url)
    server.restart()                            # same port, same directory: the AOF survives
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """``redis-server`` on a free port of 127.0.0.1, with its data in a temporary directory.

    ``config`` adds settings (``{"stream-node-max-entries": 10}``); ``cluster=True`` makes it a
    Redis Cluster node holding ``slots`` (all of them: a one-node cluster; else see
    :func:`redis_cluster`).
    """

    def __init__(
        self,
        appendonly: bool = False,
        config: dict[str, Any] | None = None,
        cluster: bool = False,
        slots: tuple[int, int] = (0, 16383),
    ) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="bow-redis-"))
        self.cluster = cluster
        self.slots = slots
        self.bus_port = free_port()
        options: dict[str, Any] = {
            "port": self.port,
            "bind": "127.0.0.1",
            "dir": self.dir,
            "save": "",
            "appendonly": "yes" if appendonly else "no",
            "appendfsync": "always",
            "logfile": self.dir / "redis.log",
        }
        if cluster:
            options["cluster-enabled"] = "yes"
            options["cluster-config-file"] = self.dir / "nodes.conf"
            options["cluster-port"] = self.bus_port
            options["cluster-node-timeout"] = 500
        self.args = ["redis-server", *_flags({**options, **(config or {})})]
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def sentinel(cls, master: RedisServer, service: str) -> RedisServer:
        """A Redis Sentinel (not started) that monitors ``master`` as ``service``."""
        server = cls()
        config = server.dir / "sentinel.conf"
        config.write_text(f"sentinel monitor {service} 127.0.0.1 {master.port} 1\n")
        options = {"port": server.port, "bind": "127.0.0.1", "dir": server.dir}
        server.args = ["redis-server", str(config), "--sentinel", *_flags(options)]
        server.args += _flags({"logfile": server.dir / "redis.log"})
        return server

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and return once it answers ``PING`` (and its cluster is ready)."""
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not on PATH")
        self.process = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while self.command("PING") != "+PONG":
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}:\n{log}")
            time.sleep(0.01)
        if self.cluster:
            first, last = (str(slot) for slot in self.slots)
            self.command("CLUSTER", "ADDSLOTSRANGE", first, last)  # refused after a restart: fine
            if self.slots == (0, 16383):
                self.wait_for_cluster(deadline)
        return self

    def wait_for_cluster(self, deadline: float, nodes: int = 1) -> None:
        """Until this node says its cluster can serve and knows ``nodes`` nodes (a new cluster
        node waits 2 s before it says so)."""
        wanted = ("cluster_state:ok", f"cluster_known_nodes:{nodes}\r")
        while not all(w in self.command("CLUSTER", "INFO", first_line=False) for w in wanted):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster on port {self.port} is not ready")
            time.sleep(0.05)

    def stop(self, kill: bool = False) -> None:
        """Stop the server (``SIGKILL`` if ``kill``); the directory stays for :meth:`restart`."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)  # in case it was paused
            process.kill() if kill else process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> RedisServer:
        self.stop()
        return self.start()

    def pause(self) -> None:
        """``SIGSTOP``: connections stay open, nothing answers, until :meth:`resume`."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def command(self, *args: str, first_line: bool = True) -> str:
        """Send one command, answer its reply (``""`` if the server cannot be reached).

        Only the first line of the reply is awaited and answered, unless ``first_line`` is false.
        """
        request = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(request.encode())
                reply = b""
                while not reply.endswith(b"\r\n") or not (first_line or _complete(reply)):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
        except OSError:
            return ""
        text = reply.decode(errors="replace")
        return text.split("\r\n", 1)[0] if first_line else text

    def __enter__(self) -> RedisServer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


@contextlib.contextmanager
def redis_cluster(nodes: int = 3, timeout: float = 20.0) -> Iterator[list[RedisServer]]:
    """A Redis Cluster of ``nodes`` masters (no replicas), the slots split evenly between them."""
    bounds = [16384 * n // nodes for n in range(nodes + 1)]
    servers = [
        RedisServer(cluster=True, slots=(bounds[n], bounds[n + 1] - 1)) for n in range(nodes)
    ]
    try:
        for server in servers:
            server.start()
        for server in servers[1:]:
            server.command(
                "CLUSTER", "MEET", "127.0.0.1", str(servers[0].port), str(servers[0].bus_port)
            )
        deadline = time.monotonic() + timeout
        for server in servers:
            server.wait_for_cluster(deadline, nodes)
        yield servers
    finally:
        for server in servers:
            server.close()


def _flags(options: dict[str, Any]) -> list[str]:
    return [arg for name, value in options.items() for arg in (f"--{name}", str(value))]


def _complete(reply: bytes) -> bool:
    """Whether a simple or bulk-string reply has fully arrived."""
    if not reply.startswith(b"$"):
        return True
    header, _, body = reply.partition(b"\r\n")
    return len(body) >= int(header[1:]) + 2
