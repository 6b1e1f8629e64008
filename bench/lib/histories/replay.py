"""``history_bench.py``'s part ``replay``: a topic filled while nobody listened, then replayed to
one protocol-2 connection, ``replay`` after ``replay``, every sequence once and in order."""

from __future__ import annotations

import argparse
import asyncio
import signal
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from lib import proc, stats
from lib.histories.messages import AUDIENCE, REPLAYED, monotonic_ns
from lib.histories.parts import Part, py_spy, replay_file, start_part
from lib.histories.posting import caught_up, fill
from lib.histories.redis_figures import memory_usage
from lib.histories.subscriber import Subscriber, subscribe
from lib.private_redis import RedisServer
from lib.stats import pct

TARGET_REPLAY = 70_000  # messages/s replayed to one connection


@dataclass
class Totals:
    """Every replay so far: messages, wall seconds, gateway's and Redis's CPU seconds."""

    count: int = 0
    wall: float = 0.0
    gateway: float = 0.0
    redis: float = 0.0


async def fill_topic(args: argparse.Namespace, part: Part, client: Redis) -> int:
    """``--fill`` messages in the topic, nobody connected, read by the gateway's consumer; the
    length of the topic's stream."""
    probe = await subscribe(part.port, "chat/probe", "probe", room=3)
    posting, took = await fill(part.url, REPLAYED, args.fill, 1000, args.posters, AUDIENCE)
    key = f"{{{part.namespace}}}:topic:{REPLAYED}"
    length = int(await client.xlen(key))
    print(
        f"  filled {REPLAYED!r} with {posting.accepted:,} messages in {took:.1f} s "
        f"({posting.accepted / took:,.0f}/s, batches of 1,000, nobody connected); "
        f"its stream holds {length:,} entries ({await memory_usage(client, key) / 2**20:.1f} "
        "MiB)",
        flush=True,
    )
    lag = await caught_up(part.url, probe)  # else the replayer would get the fill live
    print(f"  the gateway's consumer had read the fill {lag:.1f} s later", flush=True)
    return length


async def replay_once(
    part: Part, redis: RedisServer, subscriber: Subscriber, start: int, totals: Totals
) -> tuple[bool, int, list[str]]:
    """One ``replay`` from ``start``, timed from the emit to its ack: (right, messages, row)."""
    ok = True
    await part.command("stall")
    gw0 = (await part.command("cpu"))["cpu_ns"]
    redis0, count0 = proc.cpu_seconds(redis.pid), subscriber.replayed
    live0 = subscriber.count - subscriber.replayed
    started = monotonic_ns()
    result: Any = await asyncio.wait_for(
        subscriber.replay({"topic": REPLAYED, "start": start}), 120
    )
    wall = (monotonic_ns() - started) / 1e9
    gw = ((await part.command("cpu"))["cpu_ns"] - gw0) / 1e9
    redis_cpu = proc.cpu_seconds(redis.pid) - redis0
    stall = (await part.command("stall"))["stall"]["longest"]
    got = subscriber.replayed - count0
    live = subscriber.count - subscriber.replayed - live0
    count = result.get("count") if isinstance(result, dict) else None
    if count != got or live:
        print(
            f"  FAILED: the ack says {result}, the client received {got:,} replayed "
            f"events and {live:,} live ones"
        )
        ok = False
    row = [
        str(start),
        f"{got:,}",
        f"{wall:.2f}",
        f"{got / wall:,.0f}",
        f"{gw * 1e6 / max(1, got):.1f}",
        pct(gw, wall),
        pct(redis_cpu, wall),
        f"{stall * 1e3:.1f} ms",
    ]
    totals.count, totals.wall = totals.count + got, totals.wall + wall
    totals.gateway, totals.redis = totals.gateway + gw, totals.redis + redis_cpu
    return ok, got, row


def check(subscriber: Subscriber, length: int, totals: Totals) -> bool:
    """Every sequence once, in order, replayed; and the target met."""
    ok = True
    missing, duplicated, beyond = subscriber.check(length)
    per = max(1, totals.count) / 1e6
    print(
        f"  in all: {totals.count:,} replayed in {totals.wall:.2f} s = "
        f"{totals.count / totals.wall:,.0f} messages/s; gateway {totals.gateway / per:.1f} "
        f"µs/message, Redis {totals.redis / per:.1f} µs/message; "
        f"sequences 1..{length:,}: {missing:,} missing, {duplicated:,} more than once, "
        f"{subscriber.disorder:,} out of order, {subscriber.replayed:,} marked replayed"
    )
    if missing or duplicated or beyond or subscriber.disorder or subscriber.lost:
        print("  FAILED: the replays did not give every message once, in order")
        ok = False
    rate = totals.count / totals.wall if totals.wall else 0.0
    verdict = "met" if rate >= TARGET_REPLAY else "MISSED"
    print(f"  target: >= {TARGET_REPLAY:,} messages/s replayed: {rate:,.0f}/s, {verdict}")
    return ok and rate >= TARGET_REPLAY


async def replay_part(args: argparse.Namespace, redis: RedisServer, client: Redis) -> bool:
    part = start_part(args, redis, "replay")
    ok = True
    try:
        length = await fill_topic(args, part, client)
        subscriber = await subscribe(part.port, REPLAYED, "replayer")
        await asyncio.sleep(0.5)
        rows = []
        start, totals = 0, Totals()
        spy = py_spy(part.pid, None, replay_file(args.py_spy)) if args.py_spy else None
        while True:
            right, got, row = await replay_once(part, redis, subscriber, start, totals)
            ok = ok and right
            rows.append(row)
            if not got or subscriber.last_replayed >= length:
                break
            start = subscriber.last_replayed + 1
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
            print(f"  py-spy profile of the gateway over the replays: {replay_file(args.py_spy)}")
        headers = ["start", "replayed", "wall s", "messages/s", "gw µs/message", "gateway CPU"]
        headers += ["redis CPU", "longest stall"]
        print("  Each replay timed from the emit to its ack {count}.")
        print(stats.table(headers, rows))
        ok = check(subscriber, length, totals) and ok
        subscriber.close()
    finally:
        part.gateways.stop()
    return ok
