"""The lean Socket.IO client: one Socket.IO connection over a websocket, frames parsed by hand."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import struct
from typing import Any

from lib import gateway
from lib.lean.books import EVENT, Books, Message, monotonic_ns

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
SOCKET_PATH = f"/socket.io/?EIO=4&transport=websocket&v={gateway.OUTBOUND_VERSION}"


def client_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    """A final WebSocket frame, masked as every client frame must be (RFC 6455 section 5.3)."""
    length = len(payload)
    if length < 126:
        header = bytes((0x80 | opcode, 0x80 | length))
    elif length < 65_536:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
    key = os.urandom(4)
    mask = int.from_bytes((key * (length // 4 + 1))[:length], "big")
    return header + key + (int.from_bytes(payload, "big") ^ mask).to_bytes(length, "big")


def socket_path(proto: int) -> str:
    """The handshake's path: protocol 2 opts in with ``proto=2`` next to ``v``."""
    return SOCKET_PATH + ("&proto=2" if proto == 2 else "")


class LeanClient(asyncio.Protocol):
    """One Socket.IO connection over a websocket: handshake, authentication, then counting.

    ``ready`` is done once the gateway has acknowledged ``authenticate``. Every event frame of
    the benchmark found in ``books.frames`` costs a dict look-up, an ``array.append`` and two
    decrements; anything else (handshake, pings, a first copy) goes through ``_packet``.

    ``proto=2`` opts in to protocol 2 (``&proto=2``) and authenticates with
    ``(token, options, ack)`` (``options``: ``{}``, or ``{"since": position}`` to recover); the
    ack's result object is kept in ``result``, and ``position`` is the last position received
    (an event's ``meta.position``, ``__position``, ``__gap`` or the ack's).
    """

    def __init__(
        self,
        books: Books,
        host: str,
        token: str,
        proto: int = 1,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.books = books
        self.host = host
        self.token = token
        self.proto = proto
        self.options = options if options is not None else {}
        self.result: Any = None  # protocol 2: the ack's result object
        self.position: str | None = None  # protocol 2: the last position received
        self.gaps: list[Any] = []  # protocol 2: the meta of every __gap
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.received = 0  # event frames of the benchmark
        self.reason = ""  # why the gateway closed this socket, if it said
        self.lost = False
        self._accept = b""
        self._upgraded = False
        self._buffer = b""

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        key = base64.b64encode(os.urandom(16))
        self._accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
        transport.write(
            f"GET {self._path()} HTTP/1.1\r\nHost: {self.host}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n".encode()
            + b"Sec-WebSocket-Key: "
            + key
            + b"\r\n\r\n"
        )

    def _path(self) -> str:
        return socket_path(self.proto)

    def data_received(self, data: bytes) -> None:
        if self._buffer:
            data = self._buffer + data
            self._buffer = b""
        if not self._upgraded:
            data = self._upgrade(data)
        if data:
            rest = self._frames(data)
            if rest:
                self._buffer = rest

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        reason = self.reason or (f"{type(exc).__name__}: {exc}" if exc else "closed by the peer")
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(reason))
        elif not self.books.closing:
            self.books.dropped.append(reason)

    # the hot path

    def _frames(self, data: bytes) -> bytes:
        """Handle every whole frame of ``data``; return what is left of a partial one."""
        now = monotonic_ns()
        books = self.books
        frames = books.frames
        latencies = books.latencies
        acks: list[bytes] = []
        pos, end = 0, len(data)
        while end - pos >= 2:
            length = data[pos + 1]  # a server's frames are not masked
            if length < 126:
                start = pos + 2
            elif length == 126:
                if end - pos < 4:
                    break
                length = (data[pos + 2] << 8) | data[pos + 3]
                start = pos + 4
            else:
                if end - pos < 10:
                    break
                length = int.from_bytes(data[pos + 2 : pos + 10], "big")
                start = pos + 10
            stop = start + length
            if stop > end:
                break
            payload = data[start:stop]
            message = frames.get(payload)
            if message is None:
                message = self._packet(data[pos] & 0x0F, payload)
            if message is not None:
                latencies.append(now - message.sent)
                self.received += 1
                self.position = message.position
                if message.ack:  # the event asked for an ACK (a receipt): answered at once
                    acks.append(message.ack)
                message.remaining -= 1
                if message.remaining == 0:
                    books.finish(message, now)
            pos = stop
        if acks and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(acks))
        return data[pos:]

    # everything else

    def _packet(self, opcode: int, payload: bytes) -> Message | None:
        """A frame not seen before: returns its message if it is the first copy of one."""
        if opcode == 0x1:
            if payload == b"2":  # Engine.IO PING
                self._send(b"3")
            elif payload.startswith(b"42"):
                return self._event(payload)
            elif payload.startswith(b"43"):  # the ack of authenticate
                if not self.ready.done():
                    self._acknowledged(payload)
                    self.ready.set_result(None)
            elif payload.startswith(b"40"):  # connected to "/"
                arguments: list[Any] = ["authenticate", self.token]
                if self.proto == 2:
                    arguments.append(self.options)
                self._send(b"420" + json.dumps(arguments).encode())
            elif payload.startswith(b"0"):  # Engine.IO OPEN
                self._send(b"40")
            elif payload.startswith((b"44", b"41", b"1")):
                self.reason = self.reason or f"Socket.IO/Engine.IO {payload[:200]!r}"
        elif opcode == 0x8:  # close
            self.reason = self.reason or f"websocket close {payload[:2].hex()}"
            self._send(payload[:2], 0x8)
            if self.transport is not None:
                self.transport.close()
        elif opcode == 0x9:  # websocket ping
            self._send(payload, 0xA)
        return None

    def _acknowledged(self, payload: bytes) -> None:
        """``430[]`` (protocol 1) or ``430[{result}]`` (protocol 2)."""
        if self.proto != 2:
            return
        try:
            self.result = json.loads(payload[payload.index(b"[") :])[0]
        except (ValueError, IndexError):
            self.result = None
        if isinstance(self.result, dict):
            self.position = self.result.get("position") or self.position

    def _event(self, payload: bytes) -> Message | None:
        """``42[...]``, or ``42<id>[...]`` asking for an ACK (``43<id>[]``) of each copy."""
        head = payload.find(b"[")
        digits = payload[2:head] if head > 2 else b""
        if digits and not digits.isdigit():
            return None
        try:
            name, *args = json.loads(payload[2 + len(digits) :])
        except ValueError:
            return None
        meta = args[1] if self.proto == 2 and len(args) > 1 else None
        if name == "__position" or name == "__gap":  # protocol 2's gateway events
            if isinstance(meta, dict) and meta.get("position"):
                self.position = meta["position"]
            if name == "__gap":
                self.gaps.append(meta)
            return None
        if name != EVENT:  # e.g. "alert": why the gateway is about to close this socket
            self.reason = f"{name}: {args}"
            return None
        ack = client_frame(b"43" + digits + b"[]") if digits else b""
        return self.books.first_receipt(payload, args[0] if args else None, meta, ack)

    def _upgrade(self, data: bytes) -> bytes:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            self._buffer = data
            return b""
        head = data[:end]
        if not head.startswith(b"HTTP/1.1 101") or self._accept not in head:
            self.reason = f"websocket upgrade refused: {head[:200]!r}"
            if self.transport is not None:
                self.transport.close()
            return b""
        self._upgraded = True
        return data[end + 4 :]

    def _send(self, payload: bytes, opcode: int = 0x1) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(client_frame(payload, opcode))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
