"""``reach_bench.py``'s gateway process (``lib/gateway.py`` with ``--config``, pinned to a CPU)
and its webhook receiver."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pstats
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from standardwebhooks import Webhook as Verifier
from standardwebhooks import WebhookVerificationError

from lib.gateways import spawn
from lib.private_redis import free_port

SCRIPT = Path(__file__).resolve().with_name("gateway.py")
SECRET = "whsec_" + base64.b64encode(b"reach-bench-secret-0123456789abc").decode()


class Gateway:
    """One ``lib/gateway.py`` on ``redis`` and ``namespace``, on CPU ``cpu``."""

    def __init__(
        self,
        redis: str,
        namespace: str,
        cpu: int,
        webhook: str | None = None,
        profile: str | None = None,
    ) -> None:
        # 10,000 sockets connect in seconds (not 20 s at the default 500 a second), and each
        # /_bow/reach counts as a /count (at the default 20 a second most would be 429)
        config: dict[str, Any] = {
            "outbound": {"max_connects_per_second": 5_000},
            "api": {"max_counts_per_second": 1_000_000},
        }
        if webhook is not None:
            events = ["message.undelivered"]
            config["webhooks"] = [{"url": webhook, "secret": SECRET, "events": events}]
        line = [sys.executable, str(SCRIPT), "--redis", redis, "--namespace", namespace]
        line += ["--config", json.dumps(config)]
        if profile is not None:
            line += ["--profile", profile]
        if shutil.which("taskset"):
            line = ["taskset", "-c", str(cpu), *line]
        self.profile = profile
        self.process, started = spawn(line)
        self.pid = int(started["pid"])
        self.url = f"http://127.0.0.1:{started['port']}"
        self.port = int(started["port"])

    async def command(self, text: str) -> dict[str, Any]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(text.encode() + b"\n")
        stdin.flush()
        line = await asyncio.get_running_loop().run_in_executor(None, stdout.readline)
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def cpu(self) -> float:
        """The gateway's CPU time so far, in seconds."""
        return float((await self.command("cpu"))["cpu_ns"]) / 1e9

    def start_profile(self) -> None:
        if self.profile is not None:
            os.kill(self.pid, signal.SIGUSR1)

    async def stop_profile(self, name: str, top: int = 15) -> None:
        """Stop cProfile, keep its stats as ``<profile>.<name>`` and print its top functions."""
        if self.profile is None:
            return
        os.kill(self.pid, signal.SIGUSR2)
        await asyncio.sleep(1.0)  # the dump is written by the gateway's loop
        kept = f"{self.profile}.{name}"
        os.replace(self.profile, kept)
        print(f"  cProfile {kept} (top by cumulative time):")
        pstats.Stats(kept).sort_stats("cumulative").print_stats(top)

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()  # the end of its stdin stops it
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class Receiver:
    """An aiohttp webhook receiver answering 204; every request verified, recorded with its
    arrival (wall clock) and its parsed body."""

    port: int = field(default_factory=free_port)
    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    unverified: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        at = time.time()
        try:
            parsed = Verifier(SECRET).verify(body, dict(request.headers))
        except WebhookVerificationError:
            self.unverified += 1
            return web.Response(status=401)
        self.received.append((at, parsed))
        return web.Response(status=204)
