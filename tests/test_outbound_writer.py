"""The writer over a real loopback TCP connection: frames written after a transport's first in
one event-loop step are held and written together at the step's end, in order, counted against
the connection's buffer bound, and never overtaken by an alert or a replay."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from bow_gateway.outbound.connection import Connection
from bow_gateway.outbound.writer import Writer
from bow_gateway.wire.frames import websocket_frame


class CountingTransport:
    """A real transport whose ``write`` calls are counted (what goes out is unchanged)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


@dataclass
class Link:
    """A connection whose transport is the server side of a loopback TCP connection."""

    connection: Connection
    transport: CountingTransport
    reader: asyncio.StreamReader
    slow: list[Connection] = field(default_factory=list)

    async def received(self, size: int) -> bytes:
        return await asyncio.wait_for(self.reader.readexactly(size), 5)


@pytest.fixture
async def link() -> AsyncIterator[Link]:
    accepted: asyncio.Future[asyncio.Transport] = asyncio.get_running_loop().create_future()

    class Accept(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            accepted.set_result(transport)

    server = await asyncio.get_running_loop().create_server(Accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, client = await asyncio.open_connection("127.0.0.1", port)
    transport = CountingTransport(await accepted)
    connection = Connection("sid", "eio", None)  # type: ignore[arg-type]  # no plugin needed
    connection.transport = transport  # type: ignore[assignment]
    yield Link(connection, transport, reader)
    client.close()
    transport.close()
    server.close()
    await server.wait_closed()


def frames(count: int, tag: str = "m") -> list[bytes]:
    return [websocket_frame(f"{tag}{n:04d}".encode()) for n in range(count)]


async def test_frames_after_the_first_in_one_step_go_out_together_in_order(link: Link) -> None:
    writer = Writer(link.slow.append)
    sent = frames(100)
    for frame in sent:
        assert writer.write(link.connection, b"", frame)
    assert link.transport.writes == [sent[0]]  # the first at once, the rest held
    await asyncio.sleep(0)
    assert link.transport.writes == [sent[0], b"".join(sent[1:])]
    assert await link.received(sum(map(len, sent))) == b"".join(sent)


async def test_a_frame_in_a_later_step_is_written_at_once(link: Link) -> None:
    writer = Writer(link.slow.append)
    first, second = frames(2)
    writer.write(link.connection, b"", first)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    writer.write(link.connection, b"", second)
    assert link.transport.writes == [first, second]


async def test_an_alert_goes_out_after_the_frames_held_before_it(link: Link) -> None:
    writer = Writer(link.slow.append)
    sent = frames(3)
    for frame in sent:
        writer.write(link.connection, b"", frame)
    writer.write_alert(link.connection, b'0{"last":true}')
    alert = link.connection.codec.frame(b'0{"last":true}')
    expected = b"".join(sent) + alert
    assert await link.received(len(expected)) == expected


async def test_held_frames_count_toward_the_buffer_bound(link: Link) -> None:
    writer = Writer(link.slow.append, max_buffered_bytes=1_000)
    big = websocket_frame(b"x" * 400)
    results = [writer.write(link.connection, b"", big) for _ in range(5)]
    # the first is written (the kernel takes it), three are held (1,206 bytes), and the fifth
    # finds more than 1,000 bytes waiting: slow
    assert results == [True, True, True, True, False]
    assert link.slow == [link.connection]
    assert writer.buffered(link.connection) >= 800


async def test_a_replay_begun_after_held_frames_comes_after_them(link: Link) -> None:
    writer = Writer(link.slow.append)
    live = frames(3, "live")
    for frame in live:
        writer.write(link.connection, b"", frame)
    replayed = [b"r1", b"r2"]
    writer.begin_replay(link.connection, replayed)
    writer.write(link.connection, b"after")  # behind the replay
    await writer.replay(link.connection)
    codec = link.connection.codec
    expected = b"".join(live) + b"".join(codec.frame(p) for p in [*replayed, b"after"])
    assert await link.received(len(expected)) == expected
