"""``history_bench.py``'s part ``retain``: retained messages POSTed in batches by several posters,
accepted and delivered to one protocol-2 subscriber, end to end, every sequence once."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from redis.asyncio import Redis

from lib import proc, stats
from lib.histories.messages import LIVE, batch_body
from lib.histories.parts import Part, py_spy, start_part
from lib.histories.posting import Posting, post_loop, session_for
from lib.histories.redis_figures import (
    commandstats,
    commandstats_delta,
    latency_text,
    redis_latency,
)
from lib.histories.subscriber import Subscriber, subscribe
from lib.private_redis import RedisServer
from lib.proc import Machine
from lib.stats import pct

TARGET_RETAIN = 35_000  # messages/s accepted and delivered end to end (batches of 100)


@dataclass
class Posters:
    """The posters at work: their books, the event that stops them, their tasks."""

    posting: Posting
    stop: asyncio.Event
    session: aiohttp.ClientSession
    tasks: list[asyncio.Task[None]]


@dataclass
class Window:
    """What the measured window saw."""

    wall: float
    accepted: int
    delivered: int
    backlog: int  # accepted, not yet delivered, at its end
    cores: dict[int, tuple[float, float]]
    cpu: dict[str, Any]  # Machine.delta
    stall: float
    stats: tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]
    persistence: tuple[dict[str, Any], dict[str, Any]]
    latency: subprocess.Popen[str] | None
    spy: subprocess.Popen[bytes] | None


def start_posters(args: argparse.Namespace, part: Part) -> Posters:
    posting, stop = Posting(), asyncio.Event()
    pace = None
    if args.rate > 0:
        pace = [time.monotonic(), args.batch / args.rate]
    session = session_for(args.posters)
    tasks = [
        asyncio.create_task(
            post_loop(
                session,
                part.url,
                lambda: batch_body(LIVE, args.batch),
                args.batch,
                posting,
                stop,
                pace,
            )
        )
        for _ in range(args.posters)
    ]
    return Posters(posting, stop, session, tasks)


async def measure(
    args: argparse.Namespace,
    part: Part,
    redis: RedisServer,
    client: Redis,
    subscriber: Subscriber,
    posting: Posting,
) -> Window:
    """``--duration`` s of posting and delivering, measured."""
    machine = Machine([part.pid], redis.pid, [])
    await part.command("stall")
    stats0, persistence0 = await commandstats(client), await client.info("persistence")
    cores0, before = proc.cpu_busy(), machine.snapshot()
    accepted0, delivered0 = posting.accepted, subscriber.count
    subscriber.record = posting.record = True
    started = time.monotonic()
    spy = py_spy(part.pid, args.duration, args.py_spy) if args.py_spy else None
    latency = redis_latency(redis.port, args.duration)
    await asyncio.sleep(args.duration)
    wall = time.monotonic() - started
    accepted, delivered = posting.accepted - accepted0, subscriber.count - delivered0
    subscriber.record = posting.record = False
    after, cores = machine.snapshot(), proc.cpu_delta(cores0, proc.cpu_busy())
    stats1, persistence1 = await commandstats(client), await client.info("persistence")
    stall = (await part.command("stall"))["stall"]["longest"]
    return Window(
        wall=wall,
        accepted=accepted,
        delivered=delivered,
        backlog=posting.accepted - subscriber.count,
        cores=cores,
        cpu=Machine.delta(before, after),
        stall=stall,
        stats=(stats0, stats1),
        persistence=(persistence0, persistence1),
        latency=latency,
        spy=spy,
    )


async def drain(
    args: argparse.Namespace, posters: Posters, subscriber: Subscriber, window: Window
) -> tuple[int, float]:
    """Stop the posters and wait for the subscriber to have everything accepted: (accepted in
    all, seconds it took)."""
    posters.stop.set()
    await asyncio.gather(*posters.tasks)
    await posters.session.close()
    stopped = time.monotonic()
    total = posters.posting.accepted
    deadline = stopped + args.drain
    while subscriber.count < total and time.monotonic() < deadline and not subscriber.lost:
        await asyncio.sleep(0.05)
    drained = time.monotonic() - stopped
    await asyncio.sleep(0.3)  # anything more (a duplicate) would come now
    if window.spy is not None:
        _, errors = window.spy.communicate()
        if window.spy.returncode:
            print(f"  py-spy failed: {errors.decode()[-500:]}")
        else:
            print(f"  py-spy profile of the gateway over the window: {args.py_spy}")
    return total, drained


def print_window(window: Window, subscriber: Subscriber, posting: Posting) -> None:
    wall, cpu, cores = window.wall, window.cpu, window.cores
    median, p99 = stats.percentiles(subscriber.latencies)
    post_p50, _ = stats.percentiles(posting.post_ns)
    rows = [
        [
            f"{wall:.2f}",
            f"{window.accepted:,}",
            f"{window.accepted / wall:,.0f}",
            f"{window.delivered:,}",
            f"{window.delivered / wall:,.0f}",
            f"{window.backlog:,}",
            stats.human_ns(median),
            stats.human_ns(p99),
            stats.human_ns(post_p50),
            pct(cpu["gateways"][0], wall),
            f"{cpu['gateways'][0] * 1e6 / max(1, window.delivered):.1f}",
            pct(cpu["redis"], wall),
            pct(cpu["loadgen"], wall),
            pct(cpu["other"], wall),
            f"{pct(cores[0][0], wall)} / {pct(cores[1][0], wall)}",
            f"{window.stall * 1e3:.1f} ms",
        ]
    ]
    headers = ["wall s", "accepted", "accepted/s", "delivered", "delivered/s", "backlog at end"]
    headers += ["p50", "p99", "POST p50", "gateway CPU", "gw µs/message", "redis CPU"]
    headers += ["loadgen CPU", "other CPU", "CPU 0 / CPU 1 busy", "longest stall"]
    print("  Latency: POST start to the subscriber's data_received, per delivery.")
    print(stats.table(headers, rows))
    print("  Redis over the window (INFO commandstats): command, calls, µs per call, CPU share")
    stat_rows = [
        [name, f"{calls:,}", f"{usec / calls:.2f}", pct(usec / 1e6, wall)]
        for name, calls, usec in commandstats_delta(*window.stats)[:8]
    ]
    print(stats.table(["command", "calls", "µs/call", "of wall"], stat_rows))
    persistence0, persistence1 = window.persistence
    rewrites = int(persistence1["aof_rewrites"]) - int(persistence0["aof_rewrites"])
    delayed = int(persistence1["aof_delayed_fsync"]) - int(persistence0["aof_delayed_fsync"])
    print(
        f"  redis-cli --latency over the window (PING round trips): {latency_text(window.latency)}"
    )
    print(
        f"  AOF: {rewrites} rewrite(s) during the window, {delayed} delayed fsync(s); "
        f"AOF now {int(persistence1.get('aof_current_size', 0)) / 2**20:,.0f} MiB"
    )


def verdict(
    window: Window, subscriber: Subscriber, posting: Posting, total: int, drained: float
) -> bool:
    """Every accepted message received once, and the targets met."""
    ok = True
    missing, duplicated, beyond = subscriber.check(total)
    lost = subscriber.lost or missing or duplicated or beyond
    refused = ", ".join(f"{n} x {status}" for status, n in sorted(posting.refused.items()))
    print(
        f"  after the posters stopped: {total:,} accepted in all, {subscriber.count:,} "
        f"received {drained:.2f} s later; sequences 1..{total:,}: {missing:,} missing, "
        f"{duplicated:,} more than once, {beyond:,} beyond; refused POSTs: {refused or 'none'}"
        + (f"; other events: {subscriber.others[:3]}" if subscriber.others else "")
    )
    if lost:
        print("  FAILED: the subscriber did not receive every accepted message exactly once")
        ok = False
    accepted_rate, delivered_rate = window.accepted / window.wall, window.delivered / window.wall
    for what, rate in (("accepted", accepted_rate), ("delivered", delivered_rate)):
        met = "met" if rate >= TARGET_RETAIN else "MISSED"
        print(f"  target: >= {TARGET_RETAIN:,} messages/s {what}: {rate:,.0f}/s, {met}")
        ok = ok and rate >= TARGET_RETAIN
    return ok


async def retain_part(args: argparse.Namespace, redis: RedisServer, client: Redis) -> bool:
    part = start_part(args, redis, "retain")
    try:
        subscriber = await subscribe(part.port, LIVE, "subscriber")
        posters = start_posters(args, part)
        offered = f"paced at {args.rate:,.0f} messages/s" if args.rate > 0 else "back to back"
        print(
            f"  {args.posters} posters, batches of {args.batch} messages to {LIVE!r} ({offered});"
            f" 1 protocol-2 subscriber; warm-up {args.warmup:g} s, then {args.duration:g} s",
            flush=True,
        )
        await asyncio.sleep(args.warmup)
        window = await measure(args, part, redis, client, subscriber, posters.posting)
        total, drained = await drain(args, posters, subscriber, window)
        print_window(window, subscriber, posters.posting)
        ok = verdict(window, subscriber, posters.posting, total, drained)
        subscriber.close()
    finally:
        part.gateways.stop()
    return ok
