"""A Gobbler client written from the seed's protocol section alone (``seeds/gobbler.md``): text
commands over a plain WebSocket (aiohttp's client), messages and status messages read back.
Nothing of the gateway is imported."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

WAIT = 5.0


@dataclass
class GobblerMessage:
    """``path,sequenceId,publisherUserId,publisherApplicationId,publisherMessageId,time``, the
    headers' JSON, the body."""

    path: str
    sequence: int
    user_id: str
    application_id: str
    message_id: str
    time: int
    headers: dict[str, Any]
    body: str


@dataclass
class Status:
    """``#kind text`` or ``!kind text``, and the JSON data on the next line if any."""

    kind: str
    text: str
    data: Any = None


def parse(frame: str) -> GobblerMessage | Status:
    first, _, rest = frame.partition("\n")
    if first[:1] in ("#", "!"):
        kind, _, text = first.partition(" ")
        return Status(kind, text, json.loads(rest) if rest else None)
    head = first.split(",")
    headers_line, _, body = rest.partition("\n")
    return GobblerMessage(
        head[0],
        int(head[1]),
        head[2],
        head[3],
        head[4],
        int(head[5]),
        json.loads(headers_line) if headers_line else {},
        body,
    )


class GobblerClient:
    """One connection: frames read in order."""

    def __init__(self, websocket: aiohttp.ClientWebSocketResponse) -> None:
        self.websocket = websocket

    @classmethod
    async def open(
        cls,
        http: aiohttp.ClientSession,
        url: str,
        token: str | None = None,
        *,
        path: str = "/gobbler",
        query: str = "",
    ) -> GobblerClient:
        ws_url = url.replace("http://", "ws://", 1) + path + query
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return cls(await http.ws_connect(ws_url, headers=headers))

    async def send(self, command: str) -> None:
        await self.websocket.send_str(command)

    async def next(self, timeout: float = WAIT) -> GobblerMessage | Status:
        message = await self.websocket.receive(timeout=timeout)
        assert message.type is aiohttp.WSMsgType.TEXT, message
        return parse(str(message.data))

    async def status(self, kind: str, timeout: float = WAIT) -> Status:
        frame = await self.next(timeout)
        assert isinstance(frame, Status) and frame.kind == kind, frame
        return frame

    async def message(self, timeout: float = WAIT) -> GobblerMessage:
        frame = await self.next(timeout)
        assert isinstance(frame, GobblerMessage), frame
        return frame

    async def fetch(self, command: str) -> tuple[Status, list[GobblerMessage], Status]:
        """Send a ``+`` with a start: ``#fetch-start``, the messages, ``#fetch-done``."""
        await self.send(command)
        start = await self.status("#fetch-start")
        messages = []
        while isinstance(frame := await self.next(), GobblerMessage):
            messages.append(frame)
        assert frame.kind == "#fetch-done", frame
        return start, messages, frame

    async def nothing_within(self, seconds: float) -> bool:
        try:
            message = await self.websocket.receive(timeout=seconds)
        except TimeoutError:
            return True
        raise AssertionError(f"unexpected {message}")

    async def closed(self, timeout: float = WAIT) -> int | None:
        async with asyncio.timeout(timeout):
            while True:
                message = await self.websocket.receive()
                if message.type in (
                    aiohttp.WSMsgType.CLOSE,
                    aiohttp.WSMsgType.CLOSED,
                    aiohttp.WSMsgType.ERROR,
                ):
                    return self.websocket.close_code

    async def close(self) -> None:
        await self.websocket.close()
