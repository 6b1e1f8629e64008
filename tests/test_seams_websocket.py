"""The gateway's own Engine.IO websocket (bow_gateway/seams/websocket.py, its frames
bow_gateway/wire/frames.py): the opening handshake, frames as RFC 6455 has clients send them, the
close handshake, and what aiohttp lets go of once the connection is the gateway's. A raw TCP client
writes exactly the bytes each test says.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct
from collections.abc import Awaitable, Callable

import pytest

from bow_gateway import Bow
from bow_gateway.wire.frames import unmask

from .support import base_config, standard_bow, token, until

WAIT = 10.0
PATH = "/socket.io/?EIO=4&transport=websocket&v=1.3"


def frame(payload: bytes, opcode: int = 0x1, *, final: bool = True, masked: bool = True) -> bytes:
    """A client's frame: masked (as RFC 6455 requires of clients) unless told otherwise."""
    first = (0x80 if final else 0) | opcode
    length = len(payload)
    mask_bit = 0x80 if masked else 0
    if length < 126:
        head = bytes((first, mask_bit | length))
    elif length < 65_536:
        head = struct.pack("!BBH", first, mask_bit | 126, length)
    else:
        head = struct.pack("!BBQ", first, mask_bit | 127, length)
    if not masked:
        return head + payload
    mask = os.urandom(4)
    return head + mask + unmask(payload, mask)


class RawWebSocket:
    """A websocket client of bytes: the handshake, then frames in and out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(
        cls, port: int, *, key: str | None = None, then: bytes = b""
    ) -> tuple[RawWebSocket, bytes]:
        """Connect and send the upgrade request (and ``then`` in the same write); the
        response's head."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        key = key if key is not None else base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
            + then
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        return cls(reader, writer), head

    async def next(self) -> tuple[int, bytes]:
        """The next frame from the gateway: its opcode and payload (never masked)."""
        first, second = await asyncio.wait_for(self.reader.readexactly(2), WAIT)
        assert not second & 0x80, "a server's frames are not masked"
        length = second & 0x7F
        if length == 126:
            length = int.from_bytes(await self.reader.readexactly(2), "big")
        elif length == 127:
            length = int.from_bytes(await self.reader.readexactly(8), "big")
        return first & 0x0F, await asyncio.wait_for(self.reader.readexactly(length), WAIT)

    async def text(self) -> str:
        opcode, payload = await self.next()
        assert opcode == 0x1, (opcode, payload)
        return payload.decode()

    async def closed_with(self, *, answer: bool = False) -> int:
        """Read until the close frame (``answer``: then send one back): its code; then the
        gateway ends the connection."""
        while True:
            opcode, payload = await self.next()
            if opcode == 0x8:
                if answer:
                    self.send(frame(payload[:2], opcode=0x8))
                try:
                    assert await asyncio.wait_for(self.reader.read(), WAIT) == b""
                except ConnectionResetError:  # also an end (what was sent after it, refused)
                    pass
                return int.from_bytes(payload[:2], "big")

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def port(bow: Bow) -> int:
    return bow.port


async def test_the_handshake_answers_101_with_the_accept_key_and_no_extension(port: int) -> None:
    key = base64.b64encode(os.urandom(16)).decode()
    ws, head = await RawWebSocket.open(port, key=key)
    accept = base64.b64encode(
        hashlib.sha1(key.encode() + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()
    )
    assert head.startswith(b"HTTP/1.1 101 ")
    assert b"Sec-WebSocket-Accept: " + accept + b"\r\n" in head
    assert b"Sec-WebSocket-Extensions" not in head
    assert (await ws.text()).startswith("0{")
    ws.close()


async def test_a_bad_key_is_refused_400(port: int) -> None:
    ws, head = await RawWebSocket.open(port, key="not-a-key")
    assert head.startswith(b"HTTP/1.1 400 ")
    ws.close()


async def test_frames_sent_with_the_upgrade_request_are_read(port: int) -> None:
    ws, head = await RawWebSocket.open(port, then=frame(b"40"))
    assert head.startswith(b"HTTP/1.1 101 ")
    assert (await ws.text()).startswith("0{")
    assert (await ws.text()).startswith("40{")
    ws.close()


async def test_a_fragmented_message_split_byte_by_byte_is_one_message(port: int) -> None:
    ws, _ = await RawWebSocket.open(port)
    assert (await ws.text()).startswith("0{")
    data = frame(b"4", final=False) + frame(b"", opcode=0x9) + frame(b"0", opcode=0x0)
    for byte in data:
        ws.send(bytes((byte,)))
        await asyncio.sleep(0)
    assert (await ws.next()) == (0xA, b"")  # the ping in between, answered
    assert (await ws.text()).startswith("40{")
    ws.close()


async def test_a_ping_is_answered_with_its_payload(port: int) -> None:
    ws, _ = await RawWebSocket.open(port)
    assert (await ws.text()).startswith("0{")
    ws.send(frame(b"hello", opcode=0x9))
    assert (await ws.next()) == (0xA, b"hello")
    ws.close()


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (frame(b"40", masked=False), 1002),  # clients must mask
        (bytes((0xC1, 0x80)) + bytes(4), 1002),  # a reserved bit: no extension was agreed
        (frame(b"x" * 126, opcode=0x9), 1002),  # a control frame over 125 bytes
        (frame(b"0", opcode=0x0), 1002),  # a continuation of nothing
        (frame(b"4\xff\xfe"), 1007),  # text that is not UTF-8
        (frame(b"4" + bytes(20_000)), 1009),  # over max_incoming_bytes (16 KiB)
        (struct.pack("!BBQ", 0x81, 0xFF, 1 << 40), 1009),  # announced, never sent
        (frame(b"4" * 9000, final=False) + frame(b"4" * 9000, opcode=0x0), 1009),
        (struct.pack("!BBQ", 0x81, 0xFF, 1 << 63), 1002),  # a 64-bit length's top bit set
        (frame((2000).to_bytes(2, "big"), opcode=0x8), 1002),  # a reserved close code
        (frame((1000).to_bytes(2, "big") + b"\xff", opcode=0x8), 1007),  # a reason not UTF-8
    ],
    # named, not derived from the bytes: a masked frame's mask is random, and pytest-xdist's
    # workers must collect the same ids
    ids=[
        "unmasked",
        "reserved-bit",
        "control-over-125",
        "continuation-of-nothing",
        "text-not-utf8",
        "over-max-incoming-bytes",
        "announced-never-sent",
        "fragments-over-max",
        "length-top-bit",
        "reserved-close-code",
        "close-reason-not-utf8",
    ],
)
async def test_a_frame_that_breaks_the_protocol_fails_the_connection_with_its_code(
    bow: Bow, data: bytes, code: int
) -> None:
    ws, _ = await RawWebSocket.open(bow.port)
    assert (await ws.text()).startswith("0{")
    ws.send(data)
    assert await ws.closed_with() == code
    ws.close()
    outbound = bow._outbound
    assert outbound is not None
    await until(lambda: not outbound.sio.eio.sockets, "the socket forgotten", timeout=WAIT)


async def test_a_client_close_is_answered_with_its_code_and_the_socket_forgotten(
    bow: Bow,
) -> None:
    outbound = bow._outbound
    assert outbound is not None
    ws, _ = await RawWebSocket.open(bow.port)
    assert (await ws.text()).startswith("0{")
    assert len(outbound.sio.eio.sockets) == 1
    ws.send(frame((4321).to_bytes(2, "big") + b"bye", opcode=0x8))
    assert await ws.closed_with() == 4321
    ws.close()
    await until(lambda: not outbound.sio.eio.sockets, "the socket forgotten", timeout=WAIT)
    assert outbound.open_connections == 0


async def test_a_socket_the_gateway_closes_gets_a_close_frame_then_the_connection_ends(
    start_bow: Callable[[Bow], Awaitable[Bow]],
) -> None:
    bow = await start_bow(standard_bow(base_config(outbound={"timeout": 0.5})))
    ws, _ = await RawWebSocket.open(bow.port)
    assert (await ws.text()).startswith("0{")
    ws.send(frame(b"40"))
    assert (await ws.text()).startswith("40{")
    # not authenticated within the timeout: an alert, a disconnect, then the close frame
    started = asyncio.get_running_loop().time()
    assert await ws.closed_with(answer=True) == 1000
    assert asyncio.get_running_loop().time() - started < 3  # not CLOSE_WAIT
    ws.close()
    outbound = bow._outbound
    assert outbound is not None
    await until(lambda: not outbound.sio.eio.sockets, "the socket forgotten", timeout=WAIT)


async def test_aiohttp_lets_go_of_an_upgraded_connection(bow: Bow) -> None:
    http_server = bow._runners[0].server
    assert http_server is not None
    ws, _ = await RawWebSocket.open(bow.port)
    assert (await ws.text()).startswith("0{")
    ws.send(frame(b"40"))
    assert (await ws.text()).startswith("40{")
    ws.send(frame(f'421["authenticate","{token("USER/1")}"]'.encode()))
    assert await ws.text() == "431[]"
    await until(lambda: not http_server.connections, "aiohttp's handler gone", timeout=WAIT)
    ws.close()
