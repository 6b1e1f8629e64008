"""Engine.IO's websocket driver, off aiohttp once the handshake is answered.

python-engineio's aiohttp driver (``engineio.async_drivers.aiohttp.WebSocket``) is replaced in
the server's ``_async["websocket"]`` by :class:`WebSocketDriver`: it answers the upgrade itself
(``101``, never compression), then takes the connection from aiohttp, as the transport's
protocol, and reads its frames (:mod:`bow_gateway.wire.frames`). The request's handler then
returns, and everything aiohttp kept for the connection (its ``RequestHandler``, the request, two
tasks, a websocket's reader, queue and writer) and the coroutine frames of the handler chain are
let go. An idle websocket is this driver and its transport, with no task of its own.

Taking the connection reaches into aiohttp 3.14's ``RequestHandler`` (:func:`_take_over`): its
buffered tail of the upgrade request, its parser and its server's table of connections.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections import deque
from typing import Any, Final, Protocol

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.web_request import BaseRequest

from ..wire.frames import FrameReader, websocket_frame

__all__ = ["WebSocketDriver", "websocket_frame"]

_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
CLOSE_WAIT: Final = 5.0
"""Seconds a websocket closed by the gateway waits for the client's close frame before the
connection is cut."""
EARLY_MESSAGES: Final = 4
"""Messages kept for the handler's :meth:`WebSocketDriver.wait` before a socket takes them (an
upgrade from long-polling waits for two): a client sending more meanwhile is closed."""


class Reader(Protocol):
    """The Engine.IO socket a websocket's messages go to once it is upgraded (a LeanSocket)."""

    def received(self, data: str | bytes) -> bool: ...

    def lost(self) -> None: ...


class WebSocketDriver(FrameReader):
    """One Engine.IO websocket: engineio's driver interface (``__call__(environ)``, ``wait``,
    ``send``, ``close``) for the handshake and the upgrade, then the connection's protocol.

    What it reads goes to :meth:`wait` until :meth:`attach` names the socket that takes the
    messages from then on, in order; the socket may pause the reading (:meth:`resume`).
    """

    __slots__ = ("_close_timer", "_early", "_reader", "_waiter", "environ", "handler", "server")

    def __init__(self, handler: Any, server: Any) -> None:
        super().__init__(server.max_http_buffer_size)
        self.handler: Any = handler  # the socket's _websocket_handler, until it returns
        self.server: Any = server
        self.environ: dict[str, Any] | None = None  # the request's, while the handler runs
        self._reader: Reader | None = None
        self._early: deque[str | bytes] | None = deque()
        self._waiter: asyncio.Future[str | bytes] | None = None
        self._close_timer: asyncio.TimerHandle | None = None

    async def __call__(self, environ: dict[str, Any]) -> web.StreamResponse:
        request: web.Request = environ["aiohttp.request"]
        accept = _handshake(request)
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("Connection lost")
        transport.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        self.transport = transport
        _take_over(request.protocol, transport, self)
        self.environ = environ
        try:
            await self.handler(self)
        finally:
            self.handler = self.environ = None
            if self._reader is None:  # no socket took it (an upgrade that failed, or the
                self.close()  # connection was lost meanwhile): closed
        return _Detached()

    def attach(self, reader: Reader) -> None:
        """From now on, what the client sends goes to ``reader``: first what :meth:`wait` did
        not take, in order."""
        early, self._early = self._early, None
        if self.transport is None:  # lost during the upgrade: not kept, so no cycle
            reader.lost()
            return
        self._reader = reader
        paused = False
        for data in early or ():
            paused = not reader.received(data) or paused
        if paused:
            self.pause()

    async def wait(self) -> str | bytes:
        """The next message, before a socket is attached (engineio's driver interface)."""
        early = self._early
        if early:
            return early.popleft()
        if self.transport is None or self.closing or early is None:
            raise OSError("websocket closed")
        waiter: asyncio.Future[str | bytes] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            data: str | bytes = await waiter
            return data
        finally:
            self._waiter = None

    async def send(self, message: str | bytes) -> None:
        """Write one message (engineio's driver interface: the upgrade's ``3probe``)."""
        if isinstance(message, bytes):
            self.write(websocket_frame(message, binary=True))
        else:
            self.write(websocket_frame(message.encode()))

    def close(self, code: int = 1000, *, now: bool = False) -> None:
        """Send a close frame (once); the connection ends when the client answers it, or at
        once if ``now`` (once what was written is sent), and is cut after :data:`CLOSE_WAIT` s
        in any case."""
        if not self.send_close(code):
            return
        transport = self.transport
        if transport is None:
            return
        if now:
            transport.close()
        self._close_timer = asyncio.get_running_loop().call_later(CLOSE_WAIT, self._cut)

    def _cut(self) -> None:
        self._close_timer = None
        if self.transport is not None:
            self.transport.abort()

    def message(self, data: str | bytes) -> bool:
        reader = self._reader
        if reader is not None:
            return reader.received(data)
        waiter = self._waiter
        early = self._early
        if waiter is not None and not waiter.done():
            waiter.set_result(data)
        elif early is not None and len(early) < EARLY_MESSAGES:
            early.append(data)
        else:
            self.fail(1008)
            return False
        return True

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(OSError("websocket closed"))
        reader, self._reader = self._reader, None  # the socket holds this driver: no cycle
        if reader is not None:
            reader.lost()


class _Detached(web.StreamResponse):
    """What the handler returns once the connection is the driver's: aiohttp writes nothing."""

    async def prepare(self, request: BaseRequest) -> AbstractStreamWriter | None:
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        return None


def _handshake(request: web.Request) -> bytes:
    """The ``Sec-WebSocket-Accept`` of a valid opening handshake (RFC 6455 section 4.2.1), else
    ``400`` as aiohttp's websocket answers; engineio checked ``Upgrade`` and ``Connection``."""
    headers = request.headers
    if request.version < (1, 1) or "websocket" != headers.get(hdrs.UPGRADE, "").lower().strip():
        raise web.HTTPBadRequest(text="not a WebSocket upgrade")
    if headers.get(hdrs.SEC_WEBSOCKET_VERSION, "") not in ("13", "8", "7"):
        raise web.HTTPBadRequest(text="unsupported WebSocket version")
    key = headers.get(hdrs.SEC_WEBSOCKET_KEY, "")
    try:
        if len(base64.b64decode(key, validate=True)) != 16:
            raise ValueError(key)
    except (binascii.Error, ValueError):
        raise web.HTTPBadRequest(text="invalid Sec-WebSocket-Key") from None
    return base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest())


def _take_over(handler: Any, transport: asyncio.Transport, protocol: WebSocketDriver) -> None:
    """Make ``protocol`` the transport's, and aiohttp's ``RequestHandler`` let go of it.

    aiohttp 3.14's handler keeps what arrived after the upgrade request in ``_message_tail``,
    and, once the request's handler returns, would parse that tail as HTTP (its ``_parser``)
    and close the transport: with no transport nor parser left it does neither, and its server
    forgets it once its task ends. What was buffered is read by ``protocol``.
    """
    tail = handler._message_tail
    handler._message_tail = b""
    handler._parser = None
    handler.keep_alive(False)  # cancels its keep-alive timer
    manager = handler._manager
    if manager is not None:
        manager.connection_lost(handler, None)
    handler.transport = None
    handler.force_close()  # only flags now: it has no transport to close
    transport.set_protocol(protocol)
    if not transport.is_reading():  # aiohttp paused it for a tail it could not parse yet
        transport.resume_reading()
    if tail:
        protocol.data_received(tail)
