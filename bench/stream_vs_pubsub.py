"""Redis pub/sub against a Redis stream, with redis.asyncio alone (no gateway, no sockets).

Run:  .venv/bin/python bench/stream_vs_pubsub.py [--events 20000] [--latency-events 3000]

A plain script, not a test. It starts a private ``redis-server`` on a free port (``--save ''
--appendonly no``; never the shared one on 6379) and compares three ways of carrying events of
``--size`` bytes (300 by default) from a publisher to a subscriber; both live in this process
and its one event loop, as in a gateway instance, which publishes what its inbound accepts and
reads what every instance published:

- ``pubsub``: ``PUBLISH`` on a channel, a ``SUBSCRIBE``d connection reads (``PubSub.listen()``);
- ``stream``: ``XADD key MAXLEN ~ 100000 * d <event>``, and a loop of ``XREAD COUNT 500 BLOCK 1000
  STREAMS key <last id read>`` (the commands of ``bow_gateway/backplanes/redis.py``);
- ``backplane``: ``bow_gateway.backplanes.redis.RedisBackplane`` itself (``publish()`` and
  ``events()``): the same two commands, plus what the class adds: an ``XINFO STREAM`` before each
  read that follows a non-empty one (to notice trimming or a reset), a task per publish and read;
- ``stream+xinfo``: ``stream`` plus that ``XINFO STREAM``, to tell its cost from the rest.

For each, three measurements:

1. *latency*: ``--latency-events`` events, one in flight (the next is published once the last
   was received): the ``PUBLISH``/``XADD`` round trip and end to end (from just before the
   publish to the subscriber's loop, ``time.monotonic_ns()`` carried in the event);
2. *throughput*: ``--events`` events published back to back, at most ``--window`` publishes in
   flight (each awaited, as concurrent POSTs would): publishes per second (first publish to last
   acknowledgement), end-to-end latency, and CPU per event of this process and of redis-server;
3. *dropped connection*: the subscriber loses its connection, ``--dropped`` events are published
   meanwhile, it reconnects; how many of them it receives. ``pubsub`` and ``stream``: the
   subscriber closes its connection, the events are published, it opens a new one (pub/sub:
   ``SUBSCRIBE`` again; stream: ``XREAD`` from the last id it had read). ``backplane``: Redis
   kills its connections (``CLIENT KILL TYPE normal``) and the events are published at once from
   another connection, while the class waits to reconnect (its own recovery path).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import _common as common
from _redis import RedisServer
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
        await self.pubsub.aclose()
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
            response = await self.read_client.xread({STREAM: self.last}, count=500, block=1000)
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
            response = await self.read_client.xread({STREAM: self.last}, count=500, block=1000)
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
        await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        # the class notices on its next read and tries again after retry_backoff (0.1 s)
        await publish_meanwhile()

    async def stop(self) -> None:
        await self.backplane.disconnect()
        with contextlib.suppress(BaseException):
            await self.reader


VARIANTS: dict[str, type[Variant]] = {
    v.name: v for v in (PubSubVariant, StreamVariant, StreamInfoVariant, BackplaneVariant)
}


@dataclass
class Measured:
    variant: str
    latency_publish: list[int] = field(default_factory=list)
    latency_e2e: list[int] = field(default_factory=list)
    latency_other: float = 0.0  # CPUs used by other processes meanwhile
    thr_events: int = 0
    thr_publish_wall: float = 0.0
    thr_delivery_wall: float = 0.0
    thr_e2e: list[int] = field(default_factory=list)
    thr_received: int = 0
    thr_own_cpu: float = 0.0
    thr_redis_cpu: float = 0.0
    thr_other_cpu: float = 0.0
    dropped: int = 0
    dropped_received: int = 0


async def measure(name: str, redis: RedisServer, args: argparse.Namespace) -> Measured:
    inbox = Inbox()
    variant = VARIANTS[name](redis.url, inbox)
    await variant.start()
    result = Measured(name)
    seq = 0
    try:
        # warm-up
        for _ in range(200):
            seq += 1
            waiter = inbox.expect(seq)
            await variant.publish(event(seq, args.size))
            await asyncio.wait_for(waiter, 5)
        inbox.reset()

        # 1. latency, one in flight
        busy_before = common.machine_busy_seconds()
        own_before, redis_before = time.process_time(), common.cpu_seconds(redis.pid)
        phase_started = time.monotonic()
        for _ in range(args.latency_events):
            seq += 1
            waiter = inbox.expect(seq)
            started = time.monotonic_ns()
            await variant.publish(event(seq, args.size))
            result.latency_publish.append(time.monotonic_ns() - started)
            await asyncio.wait_for(waiter, 5)
        result.latency_e2e = inbox.latencies
        own = time.process_time() - own_before
        redis_cpu = common.cpu_seconds(redis.pid) - redis_before
        busy = common.machine_busy_seconds() - busy_before
        wall = time.monotonic() - phase_started
        result.latency_other = max(0.0, busy - own - redis_cpu) / wall
        inbox.reset()

        # 2. throughput, --window publishes in flight
        window = asyncio.Semaphore(args.window)
        first, last_seq = seq + 1, seq + args.events
        done = inbox.expect(last_seq)
        tasks: set[asyncio.Task[None]] = set()

        async def one(s: int) -> None:
            try:
                await variant.publish(event(s, args.size))
            finally:
                window.release()

        own_before, redis_before = time.process_time(), common.cpu_seconds(redis.pid)
        busy_before = common.machine_busy_seconds()
        started = time.monotonic_ns()
        for s in range(first, last_seq + 1):
            await window.acquire()
            task = asyncio.create_task(one(s))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        published = time.monotonic_ns()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done, 30)
        await asyncio.sleep(0.05)  # stragglers: the last one published need not be the last read
        own = time.process_time() - own_before
        redis_cpu = common.cpu_seconds(redis.pid) - redis_before
        busy = common.machine_busy_seconds() - busy_before
        seq = last_seq
        result.thr_events = args.events
        result.thr_publish_wall = (published - started) / 1e9
        result.thr_delivery_wall = ((inbox.last or published) - started) / 1e9
        result.thr_e2e = inbox.latencies
        result.thr_received = len(inbox.seqs)
        result.thr_own_cpu, result.thr_redis_cpu = own, redis_cpu
        result.thr_other_cpu = max(0.0, busy - own - redis_cpu)
        inbox.reset()

        # 3. dropped connection
        admin = client(redis.url)
        dropped_first = seq + 1

        async def publish_meanwhile() -> None:
            nonlocal seq
            for _ in range(args.dropped):
                seq += 1
                if name == "pubsub":
                    await admin.publish(CHANNEL, event(seq, args.size))
                else:
                    key = (
                        variant.backplane.key.encode()  # type: ignore[attr-defined]
                        if name == "backplane"
                        else STREAM
                    )
                    await admin.xadd(
                        key, {b"d": event(seq, args.size)}, maxlen=MAX_LEN, approximate=True
                    )

        await variant.drop(admin, publish_meanwhile)
        await asyncio.sleep(0.5)  # every variant has reconnected by now
        marker = inbox.expect(MARKER)
        for _ in range(50):  # the backplane refuses while it has not noticed it is back
            try:
                await variant.publish(HEADER.pack(time.monotonic_ns(), MARKER))
                break
            except Exception:  # noqa: BLE001 - BackplaneUnavailable, retried
                await asyncio.sleep(0.1)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(marker, 10)
        result.dropped = args.dropped
        result.dropped_received = sum(1 for s in inbox.seqs if dropped_first <= s <= seq)
        await admin.aclose()
    finally:
        await variant.stop()
    return result


def signed_ns(ns: float) -> str:
    return ("-" if ns < 0 else "+") + common.human_ns(abs(ns))


def report(results: Sequence[Measured], args: argparse.Namespace) -> None:
    print()
    print(
        f"1. latency, one event in flight ({args.latency_events:,} events of {args.size} bytes; "
        "end to end = publish start to the subscriber's loop)"
    )
    rows = []
    base = next((r for r in results if r.variant == "pubsub"), None)
    for r in results:
        p50, p99, _, mean = common.summary(r.latency_e2e)
        added = "-"
        if base is not None and r is not base:
            b50, b99 = common.summary(base.latency_e2e)[:2]
            added = f"{signed_ns(p50 - b50)} / {signed_ns(p99 - b99)}"
        pub50, pub99, _, _ = common.summary(r.latency_publish)
        rows.append(
            [
                r.variant,
                common.human_ns(pub50),
                common.human_ns(pub99),
                common.human_ns(p50),
                common.human_ns(p99),
                common.human_ns(mean),
                added,
                f"{100 * r.latency_other:.0f}%",
            ]
        )
    print(
        common.table(
            [
                "variant",
                "publish p50",
                "publish p99",
                "end-to-end p50",
                "end-to-end p99",
                "mean",
                "vs pubsub p50 / p99",
                "other CPU",
            ],
            rows,
        )
    )
    print()
    print(
        f"2. throughput ({args.events:,} events, at most {args.window} publishes in flight; "
        "CPU per event: this process (publisher + subscriber) and redis-server)"
    )
    rows = []
    for r in results:
        p50, p99, _, _ = common.summary(r.thr_e2e)
        rows.append(
            [
                r.variant,
                f"{r.thr_events / r.thr_publish_wall:,.0f}",
                f"{r.thr_received / r.thr_delivery_wall:,.0f}",
                f"{r.thr_received:,}",
                common.human_ns(p50),
                common.human_ns(p99),
                f"{r.thr_own_cpu * 1e6 / r.thr_events:.1f}",
                f"{r.thr_redis_cpu * 1e6 / r.thr_events:.1f}",
                f"{100 * r.thr_other_cpu / r.thr_delivery_wall:.0f}%",
            ]
        )
    print(
        common.table(
            [
                "variant",
                "published/s",
                "received/s",
                "received",
                "end-to-end p50",
                "end-to-end p99",
                "client µs/event",
                "redis µs/event",
                "other CPU",
            ],
            rows,
        )
    )
    print()
    print(
        f"3. dropped connection: {args.dropped} events published while the subscriber was cut off"
    )
    rows = [
        [
            r.variant,
            f"{r.dropped_received} of {r.dropped}",
            "yes" if r.dropped_received == r.dropped else "NO",
        ]
        for r in results
    ]
    print(common.table(["variant", "received after reconnecting", "survives"], rows))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=20_000, help="events, throughput")
    parser.add_argument("--latency-events", type=int, default=3_000, help="events, latency")
    parser.add_argument("--window", type=int, default=8, help="publishes in flight, throughput")
    parser.add_argument("--size", type=int, default=300, help="bytes per event")
    parser.add_argument("--dropped", type=int, default=100, help="events, dropped connection")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"among {', '.join(VARIANTS)}"
    )
    parser.add_argument(
        "--quiet",
        type=float,
        default=30.0,
        help="before each variant, wait up to this many seconds for 3 quiet seconds",
    )
    parser.add_argument(
        "--pin", action="store_true", help="this process on CPU 1, redis-server on CPU 0"
    )
    args = parser.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    logging.basicConfig(level=logging.WARNING, format="  (log of %(name)s: %(message)s)")
    print(common.environment(["redis"]))
    with RedisServer(cpu=0 if args.pin else None) as redis:
        if args.pin:
            os.sched_setaffinity(0, {1})
        print(
            f"redis-server {redis.version()} (private: port {redis.port}, pid {redis.pid}, no "
            f"persistence); RESP2; "
            + ("this process on CPU 1, redis on CPU 0" if args.pin else "nothing pinned")
        )
        results = []
        for name in names:
            if args.quiet > 0:
                common.wait_for_quiet(args.quiet)
            results.append(asyncio.run(measure(name, redis, args)))
    report(results, args)
    print(f"\nload average now: {common.load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
