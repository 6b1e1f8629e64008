"""WebSocket frames (RFC 6455) as a server reads and writes them, with no extension: what the
gateway's own websocket protocol (:mod:`.websocket`) parses from a client, and the frames it writes.
"""

from __future__ import annotations

import abc
import asyncio
import struct
from typing import Final

MAX_BUFFERED: Final = 1_048_576
"""Bytes read but not parsed yet while the reading is paused: past it, the client is cut off."""
_UNACCEPTABLE_CODES: Final = frozenset({1004, 1005, 1006, 1015})


def websocket_frame(data: bytes, binary: bool = False) -> bytes:
    """An unmasked, uncompressed, final WebSocket frame (RFC 6455 section 5.2)."""
    first = 0x82 if binary else 0x81
    length = len(data)
    if length < 126:
        return bytes((first, length)) + data
    if length < 65_536:
        return struct.pack("!BBH", first, 126, length) + data
    return struct.pack("!BBQ", first, 127, length) + data


def close_frame(code: int) -> bytes:
    """A close frame with ``code`` and no reason."""
    return b"\x88\x02" + code.to_bytes(2, "big")


def unmask(payload: bytes, mask: bytes) -> bytes:
    """``payload`` XOR the repeated 4-byte ``mask``, as one big-integer operation."""
    length = len(payload)
    if not length:
        return b""
    key = (mask * ((length + 3) // 4))[:length]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(length, "big")


class FrameReader(asyncio.Protocol, abc.ABC):
    """A server's side of a websocket: masked frames parsed into whole messages (at most
    ``limit`` bytes each; text decoded) for :meth:`message`, pings answered, the close handshake.

    A protocol error fails the connection with its close code (1002, 1007 invalid UTF-8, 1009
    too big). :meth:`message` returning False pauses the reading until :meth:`resume`.
    """

    __slots__ = ("_binary", "_buffer", "_fragments", "_paused", "closing", "limit", "transport")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.transport: asyncio.Transport | None = None
        self.closing = False  # a close frame was sent: nothing more is read or written
        self._buffer = b""
        self._fragments: list[bytes] | None = None  # of a fragmented message under way
        self._binary = False  # the fragmented message's kind
        self._paused = False

    @abc.abstractmethod
    def message(self, data: str | bytes) -> bool:
        """A whole message; False to pause the reading until :meth:`resume`."""

    def write(self, frame: bytes) -> None:
        transport = self.transport
        if transport is not None and not self.closing and not transport.is_closing():
            transport.write(frame)

    def send_close(self, code: int) -> bool:
        """Write a close frame, unless one was sent: whether this one was."""
        if self.closing:
            return False
        self.closing = True
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(close_frame(code))
        return True

    def fail(self, code: int) -> None:
        """Fail the connection (RFC 6455 section 7.1.7): a close frame with ``code``, then the
        connection closes once what was written is sent."""
        self.send_close(code)
        self._buffer = b""
        if self.transport is not None:
            self.transport.close()

    def resume(self) -> None:
        """Read on after :meth:`message` returned False."""
        if not self._paused or self.closing or self.transport is None:
            return
        self._paused = False
        self._parse()
        if not self._paused and self.transport is not None:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self._buffer = self._buffer + data if self._buffer else data
        if self._paused:
            if len(self._buffer) > MAX_BUFFERED:
                self.fail(1008)
            return
        self._parse()

    def eof_received(self) -> bool | None:
        return None  # the transport closes: connection_lost follows

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        self._buffer = b""
        self._fragments = None

    def _parse(self) -> None:
        buffer = self._buffer
        size = len(buffer)
        at = 0
        while size - at >= 2 and not self._paused and self.transport is not None:
            first, second = buffer[at], buffer[at + 1]
            length = second & 0x7F
            start = at + 2
            if length == 126:
                if size - at < 4:
                    break
                length = int.from_bytes(buffer[start : start + 2], "big")
                start += 2
            elif length == 127:
                if size - at < 10:
                    break
                length = int.from_bytes(buffer[start : start + 8], "big")
                start += 8
            opcode = first & 0x0F
            if first & 0x70 or not second & 0x80:  # a reserved bit, or an unmasked frame
                self.fail(1002)
                return
            if opcode >= 8:
                if not first & 0x80 or length > 125:
                    self.fail(1002)
                    return
            elif length + sum(map(len, self._fragments or ())) > self.limit:
                self.fail(1009)
                return
            end = start + 4 + length
            if size < end:
                break
            payload = unmask(buffer[start + 4 : end], buffer[start : start + 4])
            at = end
            if not self._frame(first & 0x80, opcode, payload):
                return
        self._buffer = buffer[at:] if at < size else b""

    def _frame(self, final: int, opcode: int, payload: bytes) -> bool:
        """One frame; False once the connection is failed or closed."""
        if opcode == 0x8:
            return self._close_received(payload)
        if opcode == 0x9:  # a ping: answered, unless the client does not read what it is sent
            transport = self.transport
            if transport is not None and transport.get_write_buffer_size() < 65_536:
                self.write(bytes((0x8A, len(payload))) + payload)
            return True
        if opcode == 0xA:
            return True
        if opcode == 0x0:
            fragments = self._fragments
            if fragments is None:
                self.fail(1002)
                return False
            fragments.append(payload)
            if not final:
                return True
            self._fragments = None
            payload = b"".join(fragments)
            binary = self._binary
        elif opcode in (0x1, 0x2):
            if self._fragments is not None:
                self.fail(1002)
                return False
            binary = opcode == 0x2
            if not final:
                self._fragments, self._binary = [payload], binary
                return True
        else:
            self.fail(1002)
            return False
        if binary:
            data: str | bytes = payload
        else:
            try:
                data = payload.decode()
            except UnicodeDecodeError:
                self.fail(1007)
                return False
        if self.closing:
            return True  # closed by the gateway: what the client still sends is not read
        if not self.message(data):
            self.pause()
        return True

    def pause(self) -> None:
        """Read nothing more until :meth:`resume`."""
        self._paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def _close_received(self, payload: bytes) -> bool:
        """The client's close frame: answered (with its code) if the gateway had not sent one,
        and the connection closes."""
        code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1000
        if len(payload) == 1 or code < 1000 or code >= 5000 or code in _UNACCEPTABLE_CODES:
            code = 1002
        self.send_close(code)
        self._buffer = b""
        if self.transport is not None:
            self.transport.close()
        return False
