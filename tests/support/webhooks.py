"""A webhook receiver for the tests: a real aiohttp server on a free port that checks every
request with the ``standardwebhooks`` library, records it, and answers as the test says."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from standardwebhooks import Webhook as Verifier
from standardwebhooks import WebhookVerificationError

from .redis_server import free_port

WH_SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
ALL_TYPES = ["listener.online", "listener.offline", "message.receipt", "message.undelivered"]

Answer = tuple[int, dict[str, str]]
Answering = Callable[[list["Received"], dict[str, Any]], Answer]


@dataclass
class Received:
    """One request that verified: its webhook-id, its body parsed, when it came (monotonic)."""

    webhook_id: str
    body: dict[str, Any]
    at: float
    wall: float


@dataclass
class Receiver:
    """``answer(received_so_far, body) -> (status, headers)`` decides each answer (204 by
    default);
    ``unverified`` counts requests that did not verify (a test expects 0)."""

    secret: str = WH_SECRET
    answer: Answering = lambda seen, body: (204, {})
    port: int = field(default_factory=free_port)
    received: list[Received] = field(default_factory=list)
    unverified: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            parsed = Verifier(self.secret).verify(body, dict(request.headers))
        except WebhookVerificationError:
            self.unverified += 1
            return web.Response(status=401)
        assert request.content_type == "application/json"
        status, headers = self.answer(self.received, parsed)
        self.received.append(
            Received(request.headers["webhook-id"], parsed, time.monotonic(), time.time())
        )
        return web.Response(status=status, headers=headers)

    def ids(self) -> list[str]:
        return [seen.webhook_id for seen in self.received]

    async def wait_for(self, count: int, timeout: float = 10.0) -> None:
        """Until ``count`` requests came (any answer)."""
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.received)} webhook requests, not {count}")
            await asyncio.sleep(0.01)


def webhook_table(url: str, events: list[str] | None = None, **options: Any) -> dict[str, Any]:
    """A ``[[webhooks]]`` table for ``url``, every type unless ``events``."""
    return {"url": url, "secret": WH_SECRET, "events": events or ALL_TYPES, **options}
