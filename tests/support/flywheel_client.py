"""A Flywheel client written from the seed's protocol section alone (``seeds/flywheel.md``):
text frames over a plain WebSocket (aiohttp's client), ``B {json}`` to bind, ``P {topic} {body}``
to publish, ``R {topic} {body}`` received. Nothing of the gateway is imported."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

WAIT = 5.0


class FlywheelClient:
    """One nexus: frames the edge sent are read in order, binds answered by their response."""

    def __init__(self, websocket: aiohttp.ClientWebSocketResponse) -> None:
        self.websocket = websocket
        self._pending: list[aiohttp.WSMessage] = []  # read, not handed out yet
        self._kept: list[tuple[str, str]] = []  # R frames read while waiting for a B

    @classmethod
    async def open(
        cls, http: aiohttp.ClientSession, url: str, path: str = "/broker", **kwargs: Any
    ) -> FlywheelClient:
        ws_url = url.replace("http://", "ws://", 1) + path
        return cls(await http.ws_connect(ws_url, **kwargs))

    async def send_bind(self, **fields: Any) -> None:
        await self.websocket.send_str("B " + json.dumps(fields))

    async def bind(self, **fields: Any) -> dict[str, Any]:
        """Send a bind; its BindResponse (the next B frame; R frames before it are kept)."""
        await self.send_bind(**fields)
        kind, rest = await self._next_frame(skip_r=True)
        assert kind == "B", (kind, rest)
        response: dict[str, Any] = json.loads(rest)
        return response

    async def publish(self, topic: str, body: str) -> None:
        await self.websocket.send_str(f"P {topic} {body}")

    async def receive(self, timeout: float = WAIT) -> tuple[str, str]:
        """The next R frame's topic and body."""
        kind, rest = await self._next_frame(timeout=timeout)
        assert kind == "R", (kind, rest)
        topic, _, body = rest.partition(" ")
        return topic, body

    async def nothing_within(self, seconds: float) -> bool:
        """True if no frame arrives within ``seconds``."""
        if self._kept:
            return False
        try:
            message = await self.websocket.receive(timeout=seconds)
        except TimeoutError:
            return True
        self._pending.append(message)
        return False

    async def closed(self, timeout: float = WAIT) -> tuple[int | None, str]:
        """Read until the edge closes; the close code and reason."""
        async with asyncio.timeout(timeout):
            while True:
                message = await self._message()
                if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                    return self.websocket.close_code, str(message.extra or "")
                if message.type is aiohttp.WSMsgType.ERROR:
                    return self.websocket.close_code, ""

    async def close(self) -> None:
        await self.websocket.close()

    # -- frames -----------------------------------------------------------------------------

    async def _message(self) -> aiohttp.WSMessage:
        if self._pending:
            return self._pending.pop(0)
        return await self.websocket.receive()

    async def _next_frame(self, *, skip_r: bool = False, timeout: float = WAIT) -> tuple[str, str]:
        kept = self._kept
        if kept and not skip_r:
            return kept.pop(0)
        async with asyncio.timeout(timeout):
            while True:
                message = await self._message()
                assert message.type is aiohttp.WSMsgType.TEXT, message
                kind, _, rest = str(message.data).partition(" ")
                if skip_r and kind == "R":
                    kept.append((kind, rest))
                    continue
                return kind, rest
