"""The carriers ``stream_vs_pubsub.py`` compares, each with its publisher and subscriber in this
process: Redis pub/sub, a stream, a stream with ``XINFO STREAM``, and ``RedisBackplane``."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from bow_gateway.backplanes import Entry
from bow_gateway.backplanes.redis import RedisBackplane

HEADER = struct.Struct("<QQ")  # monotonic_ns at publish, sequence number
CHANNEL = b"bench:events"
STREAM = b"bench:stream"
MAX_LEN = 100_000
MARKER = 2**63  # the sequence number of the event that ends the dropped-connection test


def event(seq: int, size: int) -> bytes:
    head = HEADER.pack(time.monotonic_ns(), seq)
    return head + b"x" * max(0, size - len(head))


@dataclass
class Inbox:
    """What the subscriber received."""

    latencies: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    waiters: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    last: int = 0

    def receive(self, data: bytes) -> None:
        now = time.monotonic_ns()
        sent, seq = HEADER.unpack_from(data)
        self.latencies.append(now - sent)
        self.seqs.append(seq)
        self.last = now
        waiter = self.waiters.pop(seq, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def expect(self, seq: int) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters[seq] = future
        return future

    def reset(self) -> None:
        self.latencies, self.seqs, self.last = [], [], 0


class Variant:
    name = ""

    def __init__(self, url: str, inbox: Inbox) -> None:
        self.url, self.inbox = url, inbox

    async def start(self) -> None: ...
    async def publish(self, data: bytes) -> None: ...
    async def stop(self) -> None: ...
    async def drop(self, admin: Redis, publish_meanwhile: Callable[[], Any]) -> None: ...


def client(url: str) -> Redis:
    return Redis.from_url(url, protocol=2, decode_responses=False)


class PubSubVariant(Variant):
    name = "pubsub"

    async def start(self) -> None:
        self.client = client(self.url)
        await self._subscribe()

    async def _subscribe(self) -> None:
        self.sub_client = client(self.url)
        self.pubsub = self.sub_client.pubsub(ignore_subscribe_messages=True)
        await self.pubsub.subscribe(CHANNEL)
        # the confirmation, so that nothing published from now on is missed
        while await self.pubsub.get_message(timeout=1.0) is not None:
            pass
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.pubsub.listen():
            if message["type"] == "message":
                self.inbox.receive(message["data"])

    async def publish(self, data: bytes) -> None:
        await self.client.publish(CHANNEL, data)

    async def _unsubscribe(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(BaseException):
            await self.reader
        await self.pubsub.aclose()  # type: ignore[no-untyped-call]
        await self.sub_client.aclose()

    async def drop(self, admin: Redis, publish_meanwhile: Callable[[], Any]) -> None:
        await self._unsubscribe()
        await publish_meanwhile()
        await self._subscribe()

    async def stop(self) -> None:
        await self._unsubscribe()
        await self.client.aclose()


class StreamVariant(Variant):
    name = "stream"

    async def start(self) -> None:
        self.client = client(self.url)
        await self.client.delete(STREAM)
        self.last = b"0-0"
        await self._open_reader()

    async def _open_reader(self) -> None:
        self.read_client = client(self.url)
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            response: Any = await self.read_client.xread({STREAM: self.last}, count=500, block=1000)
            streams = response.items() if isinstance(response, dict) else response or []
            for _key, entries in streams:
                for entry_id, fields in entries:
                    self.last = entry_id
                    self.inbox.receive(fields[b"d"])

    async def publish(self, data: bytes) -> None:
        await self.client.xadd(STREAM, {b"d": data}, maxlen=MAX_LEN, approximate=True)

    async def _close_reader(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(BaseException):
            await self.reader
        await self.read_client.aclose()

    async def drop(self, admin: Redis, publish_meanwhile: Callable[[], Any]) -> None:
        await self._close_reader()
        await publish_meanwhile()
        await self._open_reader()  # from self.last: the id of the last entry read

    async def stop(self) -> None:
        await self._close_reader()
        await self.client.aclose()


class StreamInfoVariant(StreamVariant):
    """``stream``, plus the ``XINFO STREAM`` that RedisBackplane sends before reading on after
    every non-empty read: isolates what that check costs."""

    name = "stream+xinfo"

    async def _read(self) -> None:
        check = True
        while True:
            if check:
                await self.read_client.xinfo_stream(STREAM)
            response: Any = await self.read_client.xread({STREAM: self.last}, count=500, block=1000)
            streams = response.items() if isinstance(response, dict) else response or []
            check = False
            for _key, entries in streams:
                check = check or bool(entries)
                for entry_id, fields in entries:
                    self.last = entry_id
                    self.inbox.receive(fields[b"d"])


class BackplaneVariant(Variant):
    name = "backplane"

    async def start(self) -> None:
        self.backplane = RedisBackplane(self.url, namespace="bench-backplane")
        await self.backplane.connect()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for item in self.backplane.events():
            if isinstance(item, Entry):
                self.inbox.receive(item.data)

    async def publish(self, data: bytes) -> None:
        await self.backplane.publish(data)

    async def drop(self, admin: Redis, publish_meanwhile: Callable[[], Any]) -> None:
        await admin.execute_command(  # type: ignore[no-untyped-call]
            "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"
        )
        # the class notices on its next read and tries again after retry_backoff (0.1 s)
        await publish_meanwhile()

    async def stop(self) -> None:
        await self.backplane.disconnect()
        with contextlib.suppress(BaseException):
            await self.reader


VARIANTS: dict[str, type[Variant]] = {
    v.name: v for v in (PubSubVariant, StreamVariant, StreamInfoVariant, BackplaneVariant)
}
