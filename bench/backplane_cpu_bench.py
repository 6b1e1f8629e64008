"""Gateway CPU per event of the Redis backplane alone: publishes and the reader, no HTTP, no socket.

Run:  .venv/bin/python bench/backplane_cpu_bench.py [--window 64] [--rounds 200]

A plain script, not a test. It starts a private ``redis-server`` (never the shared one on 6379),
connects a ``RedisBackplane`` of whichever ``bow_gateway`` is imported (``PYTHONPATH=/tmp/snap``
with a ``git archive`` of another commit's ``bow_gateway/`` measures that one), and repeats: publish
``--window`` events at once, each awaited as concurrent POSTs would (``asyncio.gather``), then wait
until ``events()`` has read all of them back. It prints this process's CPU time per event over
``--rounds`` such rounds (after 30 to warm up): what one event costs the gateway on the way to
Redis and back, batching included. Redis's own CPU is not counted. Issue 16 (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from lib.private_redis import RedisServer
from redis.utils import HIREDIS_AVAILABLE

import bow_gateway
from bow_gateway.backplanes.redis import RedisBackplane

EVENT = (
    b'{"m":"v1","n":"msg","a":[{"__id":"user-42"}],"t":1763900000.123,'
    b'"p":{"name":"msg","seq":1234,"ts":12345.678,"audience":[{"__id":"user-42"}]}}'
)


async def measure(url: str, window: int, rounds: int) -> None:
    backplane = RedisBackplane(url)
    await backplane.connect()
    read = 0
    target = 0
    done = asyncio.Event()

    async def consume() -> None:
        nonlocal read
        async for _ in backplane.events():
            read += 1
            if read >= target:
                done.set()

    consumer = asyncio.create_task(consume())

    async def one_round() -> None:
        nonlocal target
        target = read + window
        done.clear()
        await asyncio.gather(*(backplane.publish(EVENT) for _ in range(window)))
        await done.wait()

    for _ in range(30):
        await one_round()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        await one_round()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    events = rounds * window
    where = os.path.dirname(bow_gateway.__file__)
    print(
        f"{where}: hiredis {HIREDIS_AVAILABLE}, window {window}: {cpu / events * 1e6:.1f} µs of "
        f"CPU per event ({events / wall:,.0f} events/s, this process {cpu / wall:.0%} of a CPU)"
    )
    consumer.cancel()
    await backplane.disconnect()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    server = RedisServer()
    try:
        asyncio.run(measure(server.url, args.window, args.rounds))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
