"""The three measurements of ``stream_vs_pubsub.py``, for one carrier: latency with one event in
flight, throughput with a window of publishes, and events published while the subscriber was
cut off."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from lib import proc
from lib.private_redis import RedisServer
from lib.pubsub.carriers import (
    CHANNEL,
    HEADER,
    MARKER,
    MAX_LEN,
    STREAM,
    VARIANTS,
    Inbox,
    Variant,
    client,
    event,
)


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


class Trial:
    """One carrier under measurement: its events numbered from 1 on, across the measurements."""

    def __init__(self, name: str, redis: RedisServer, args: argparse.Namespace) -> None:
        self.name, self.redis, self.args = name, redis, args
        self.inbox = Inbox()
        self.variant: Variant = VARIANTS[name](redis.url, self.inbox)
        self.result = Measured(name)
        self.seq = 0

    async def warm_up(self) -> None:
        inbox, variant, args = self.inbox, self.variant, self.args
        for _ in range(200):
            self.seq += 1
            waiter = inbox.expect(self.seq)
            await variant.publish(event(self.seq, args.size))
            await asyncio.wait_for(waiter, 5)
        inbox.reset()

    async def latency(self) -> None:
        """1. latency, one in flight."""
        inbox, variant, args, result = self.inbox, self.variant, self.args, self.result
        busy_before = proc.machine_busy_seconds()
        own_before, redis_before = time.process_time(), proc.cpu_seconds(self.redis.pid)
        phase_started = time.monotonic()
        for _ in range(args.latency_events):
            self.seq += 1
            waiter = inbox.expect(self.seq)
            started = time.monotonic_ns()
            await variant.publish(event(self.seq, args.size))
            result.latency_publish.append(time.monotonic_ns() - started)
            await asyncio.wait_for(waiter, 5)
        result.latency_e2e = inbox.latencies
        own = time.process_time() - own_before
        redis_cpu = proc.cpu_seconds(self.redis.pid) - redis_before
        busy = proc.machine_busy_seconds() - busy_before
        wall = time.monotonic() - phase_started
        result.latency_other = max(0.0, busy - own - redis_cpu) / wall
        inbox.reset()

    async def throughput(self) -> None:
        """2. throughput, --window publishes in flight."""
        inbox, variant, args, result = self.inbox, self.variant, self.args, self.result
        window = asyncio.Semaphore(args.window)
        first, last_seq = self.seq + 1, self.seq + args.events
        done = inbox.expect(last_seq)
        tasks: set[asyncio.Task[None]] = set()

        async def one(s: int) -> None:
            try:
                await variant.publish(event(s, args.size))
            finally:
                window.release()

        own_before, redis_before = time.process_time(), proc.cpu_seconds(self.redis.pid)
        busy_before = proc.machine_busy_seconds()
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
        redis_cpu = proc.cpu_seconds(self.redis.pid) - redis_before
        busy = proc.machine_busy_seconds() - busy_before
        self.seq = last_seq
        result.thr_events = args.events
        result.thr_publish_wall = (published - started) / 1e9
        result.thr_delivery_wall = ((inbox.last or published) - started) / 1e9
        result.thr_e2e = inbox.latencies
        result.thr_received = len(inbox.seqs)
        result.thr_own_cpu, result.thr_redis_cpu = own, redis_cpu
        result.thr_other_cpu = max(0.0, busy - own - redis_cpu)
        inbox.reset()

    async def dropped(self) -> None:
        """3. dropped connection."""
        inbox, variant, args, name = self.inbox, self.variant, self.args, self.name
        admin = client(self.redis.url)
        dropped_first = self.seq + 1

        async def publish_meanwhile() -> None:
            for _ in range(args.dropped):
                self.seq += 1
                if name == "pubsub":
                    await admin.publish(CHANNEL, event(self.seq, args.size))
                else:
                    key = (
                        variant.backplane.key.encode()  # type: ignore[attr-defined]
                        if name == "backplane"
                        else STREAM
                    )
                    await admin.xadd(
                        key, {b"d": event(self.seq, args.size)}, maxlen=MAX_LEN, approximate=True
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
        self.result.dropped = args.dropped
        self.result.dropped_received = sum(1 for s in inbox.seqs if dropped_first <= s <= self.seq)
        await admin.aclose()


async def measure(name: str, redis: RedisServer, args: argparse.Namespace) -> Measured:
    trial = Trial(name, redis, args)
    await trial.variant.start()
    try:
        await trial.warm_up()
        await trial.latency()
        await trial.throughput()
        await trial.dropped()
    finally:
        await trial.variant.stop()
    return trial.result
