"""WebSocket frames (RFC 6455) as a server reads and writes them, with no extension: what the
gateway's own websocket driver (:mod:`bow_gateway.seams.websocket`) parses from a client, and the
frames it writes. Pure wire code: no library's private parts.
"""

from __future__ import annotations

import abc
import asyncio
import struct
from typing import Final

MAX_BUFFERED: Final = 1_048_576
"""Bytes read but not parsed yet while the reading is paused: past it, the client is cut off."""


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
        self._fragments: bytearray | None = None  # a fragmented message under way, so far
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
            refused = self._refused(first, second, length)
            if refused:  # from the header alone: nothing of the payload is waited for
                self.fail(refused)
                return
            end = start + 4 + length
            if size < end:
                break
            payload = unmask(buffer[start + 4 : end], buffer[start : start + 4])
            at = end
            if not self._frame(first & 0x80, first & 0x0F, payload):
                return
        self._buffer = buffer[at:] if at < size else b""

    def _refused(self, first: int, second: int, length: int) -> int:
        """The close code a frame's header breaks the protocol with (RFC 6455 section 5), else
        0; the frames before it are handled, so a fragmented message's state is known."""
        opcode = first & 0x0F
        # a reserved bit (no extension), an unmasked frame, a 64-bit length's top bit (5.2)
        if first & 0x70 or not second & 0x80 or length >> 63:
            return 1002
        if opcode >= 8:  # a close, a ping, a pong: final, at most 125 bytes; or reserved
            return 1002 if opcode > 0xA or not first & 0x80 or length > 125 else 0
        fragments = self._fragments
        if opcode > 2 or (opcode == 0) is (fragments is None):
            return 1002  # reserved; a continuation of nothing, or a message inside another
        if length + (len(fragments) if fragments is not None else 0) > self.limit:
            return 1009
        return 0

    def _frame(self, final: int, opcode: int, payload: bytes) -> bool:
        """One frame :meth:`_refused` let through; False once the connection is failed or
        closed."""
        if opcode == 0x8:
            return self._close_received(payload)
        if opcode == 0x9:  # a ping: answered, unless the client does not read what it is sent
            transport = self.transport
            if transport is not None and transport.get_write_buffer_size() < 65_536:
                self.write(bytes((0x8A, len(payload))) + payload)
            return True
        if opcode == 0xA:
            return True
        whole: bytes | bytearray = payload
        if opcode == 0x0:
            fragments = self._fragments
            assert fragments is not None  # checked by _refused
            fragments += payload
            if not final:
                return True
            self._fragments = None
            whole, binary = fragments, self._binary
        else:
            binary = opcode == 0x2
            if not final:
                self._fragments, self._binary = bytearray(payload), binary
                return True
        if binary:
            data: str | bytes = bytes(whole)
        else:
            try:
                data = whole.decode()
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
        and the connection closes; an invalid code is answered 1002, a reason not UTF-8 1007."""
        code = 1000  # no code received: a normal closure
        if len(payload) == 1:
            code = 1002
        elif payload:
            code = int.from_bytes(payload[:2], "big")
            if not _valid_close_code(code):
                code = 1002
            else:
                try:
                    payload[2:].decode()
                except UnicodeDecodeError:
                    code = 1007
        self.send_close(code)
        self._buffer = b""
        if self.transport is not None:
            self.transport.close()
        return False


def _valid_close_code(code: int) -> bool:
    """Whether a close frame may carry ``code`` (RFC 6455 section 7.4 and IANA's registry): the
    defined codes but 1004-1006 and 1015 (never sent in a frame), or 3000-4999 (libraries',
    applications'); 1016-2999 are reserved for the protocol's revisions."""
    return 1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999
