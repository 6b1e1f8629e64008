"""The lean HTTP/1.1 client of the inbound: keep-alive connections, one POST at a time each."""

from __future__ import annotations

import asyncio
import re

import aiohttp

from lib import gateway

CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


class Poster(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to the inbound: one POST at a time, its status back."""

    def __init__(self, host: str, authorization: str, headers: str = "") -> None:
        self._head = (
            f"POST {gateway.PATH} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {authorization}\r\n"
            f"{headers}Content-Type: application/json\r\nContent-Length: "
        ).encode()
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[int] | None = None
        self._buffer = b""
        self.head = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        length = CONTENT_LENGTH.search(self._buffer, 0, end + 2)
        stop = end + 4 + (int(length.group(1)) if length else 0)
        if len(self._buffer) < stop:
            return
        status = int(self._buffer[9:12])
        self.head = self._buffer[:end]  # the last answer's status line and headers
        self._buffer = self._buffer[stop:]
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError(f"the inbound closed: {exc}"))

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    async def post(self, body: bytes) -> int:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(self._head + b"%d\r\n\r\n" % len(body) + body)
        return await self._waiter


class Posters:
    """A pool of :class:`Poster` connections, reopened when the gateway has closed one;
    ``receipt`` (seconds, not 0): every POST asks for a receipt (``Bow-Receipt``)."""

    def __init__(self, host: str, port: int, receipt: int = 0) -> None:
        self._host, self._port = host, port
        self._headers = f"Bow-Receipt: {receipt}\r\n" if receipt else ""
        self._authorization = aiohttp.encode_basic_auth(gateway.USER, gateway.PASSWORD)
        self._free: asyncio.Queue[Poster | None] = asyncio.Queue()

    @property
    def authorization(self) -> str:
        """The ``Authorization`` header of the inbound (Basic Auth)."""
        return self._authorization

    def grow(self, size: int) -> None:
        for _ in range(size - self._free.qsize()):
            self._free.put_nowait(None)  # opened on first use

    async def post(self, body: bytes) -> int:
        poster = await self._free.get()
        try:
            if poster is None or not poster.usable:
                poster = Poster(f"{self._host}:{self._port}", self._authorization, self._headers)
                loop = asyncio.get_running_loop()
                await loop.create_connection(lambda: poster, self._host, self._port)
            return await poster.post(body)
        finally:
            self._free.put_nowait(poster)
