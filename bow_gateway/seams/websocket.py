"""Engine.IO's aiohttp websocket driver, lean: what a websocket keeps for its whole life.

python-engineio's driver (``engineio.async_drivers.aiohttp.WebSocket``) is replaced in the
server's ``_async["websocket"]`` by :class:`WebSocketDriver`, which never negotiates compression,
and, once the handshake is done, lets go of what aiohttp keeps for the connection's life but
never uses again on a server's websocket (reaches into aiohttp 3.14's ``RequestHandler`` and
``WebSocketWriter``, each only when it finds there what it expects).
"""

from __future__ import annotations

import asyncio
import functools
import random
import struct
from collections import deque
from typing import Any, Final

from aiohttp import web
from engineio.async_drivers import aiohttp as eio_aiohttp


def websocket_frame(data: bytes, binary: bool = False) -> bytes:
    """An unmasked, uncompressed, final WebSocket frame (RFC 6455 section 5.2)."""
    first = 0x82 if binary else 0x81
    length = len(data)
    if length < 126:
        return bytes((first, length)) + data
    if length < 65_536:
        return struct.pack("!BBH", first, 126, length) + data
    return struct.pack("!BBQ", first, 127, length) + data


class WebSocketDriver(eio_aiohttp.WebSocket):  # type: ignore[misc]
    """engineio's aiohttp websocket, without permessage-deflate, its transport known.

    Compression costs a zlib context per socket (~100 KB with clients that negotiate it, as
    socket.io-client does) and a compression per frame per socket, for frames that are small.
    """

    handler: Any  # engineio's: the socket's _websocket_handler, until it returns

    @property
    def websocket(self) -> web.WebSocketResponse:
        sock: web.WebSocketResponse = self._sock
        return sock

    async def __call__(self, environ: dict[str, Any]) -> web.WebSocketResponse:
        request = environ["aiohttp.request"]
        self._sock = web.WebSocketResponse(
            max_msg_size=self.server.max_http_buffer_size, compress=False
        )
        await self._sock.prepare(request)
        _release_http_state(request.protocol)
        _share_writer_state(getattr(self._sock, "_writer", None))
        self.environ = environ
        self.transport = request.transport
        try:
            await self.handler(self)
        finally:
            self.handler = None  # the socket's bound method: the socket keeps this driver
            # What a write to a vanished peer raised, kept with its traceback: frames that
            # refer to this response
            self._sock._exception = None
        return self._sock


def _release_http_state(protocol: Any) -> None:
    """Once a connection is a websocket, aiohttp's HTTP/1.1 parser and its queue of pipelined
    requests are never used again (what arrives goes to the websocket's reader; the handler's
    return ends the connection), yet its ``RequestHandler`` keeps both for the connection's
    life: ~1.5 KB a socket. Only when they are what aiohttp 3.14 has there, an empty queue."""
    if getattr(protocol, "_payload_parser", None) is None:
        return  # not upgraded
    if getattr(protocol, "_parser", None) is not None:
        protocol._parser = None
    messages = getattr(protocol, "_messages", None)
    if isinstance(messages, deque) and not messages:
        protocol._messages = ()  # falsy as an empty queue; appending would fail, not share


def _share_writer_state(writer: Any) -> None:
    """A server's websocket writer never masks nor compresses in the background (compression
    is never negotiated), yet each holds a ``partial`` for masks and a set for those tasks."""
    if getattr(writer, "use_mask", True) or getattr(writer, "compress", 1):
        return
    if isinstance(getattr(writer, "_background_tasks", None), set):
        writer._background_tasks = _NO_TASKS
    if isinstance(getattr(writer, "get_random_bits", None), functools.partial):
        writer.get_random_bits = _NO_MASKS


_NO_TASKS: Final[set[asyncio.Task[None]]] = set()
_NO_MASKS: Final = functools.partial(random.getrandbits, 32)
