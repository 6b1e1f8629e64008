"""The gateway that ``webhooks_bench.py`` starts in a process of its own: ``lib/gateway.py``'s
quick-start gateway with one ``[[webhooks]]`` table, events emitted through its engine.

Run by path, ``python bench/lib/webhook_gateway.py --url URL --secret S [--redis URL]``; as
``lib/gateway.py``, it imports nothing of ``lib``, only the standard library and bow_gateway.
Without ``--redis`` the events wait in this process (the memory store); with it, in that Redis
(the store of a gateway whose instances share it). Once serving it prints one JSON line
(``{"port", "pid"}``), then answers each command of its stdin with one JSON line, and stops at
the end of its stdin.

Each event is ``listener.online`` with data ``{"id": "bench/<seq>", "protocol": "bench", "seq",
"t"}`` (``t``: ``time.time()`` just before its ``emit``) and the id's JSON text as its key, as
the presence tracker makes them. Commands:

- ``burst FIRST COUNT BATCH``: events ``FIRST..FIRST+COUNT-1`` emitted as fast as can be,
  ``BATCH`` per ``emit`` call, one call after the other; answers ``{"t0", "t1"}`` (wall clock).
- ``pace FIRST COUNT RATE``: ``COUNT`` events at ``RATE`` a second, each in an ``emit`` of its
  own (as sockets authenticate one by one; at most 32 under way), answers ``{"t0", "t1",
  "late"}`` (the longest the pacing fell behind, s).
- ``cpu``: this process's CPU time (ns). ``profile`` starts cProfile, ``profile FILE`` stops it
  and writes its stats there.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import os
import sys
import time
from typing import Any

from bow_gateway.inbounds.passthrough import create_message_from_request_body
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound

from bow_gateway import Bow
from bow_gateway.webhooks import WebhookEvent, Webhooks

TYPE = "listener.online"
MAX_EMITS = 32
"""``emit`` calls under way at once when paced, at most (the Redis client's pool is bounded)."""
JWT_SECRET = "a-benchmark-secret-that-is-at-least-32-bytes-long"


def event(seq: int) -> WebhookEvent:
    ident = f"bench/{seq}"
    now = time.time()
    data = {"id": ident, "protocol": "bench", "seq": seq, "t": now}
    return WebhookEvent(TYPE, data, json.dumps(ident), now)


async def burst(engine: Webhooks, first: int, count: int, batch: int) -> dict[str, Any]:
    t0 = time.time()
    for start in range(first, first + count, batch):
        end = min(first + count, start + batch)
        await engine.emit([event(seq) for seq in range(start, end)])
    return {"t0": t0, "t1": time.time()}


async def pace(engine: Webhooks, first: int, count: int, rate: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()
    room = asyncio.Semaphore(MAX_EMITS)
    started, t0 = loop.time(), time.time()
    late = 0.0
    for n in range(count):
        due = started + n / rate
        wait = due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        else:
            late = max(late, -wait)
        await room.acquire()
        task = loop.create_task(engine.emit([event(first + n)]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        task.add_done_callback(lambda _: room.release())
    if tasks:
        await asyncio.gather(*tasks)
    return {"t0": t0, "t1": time.time(), "late": late}


class Commands:
    """What the stdin's lines ask of the gateway's engine."""

    def __init__(self, engine: Webhooks) -> None:
        self.engine = engine
        self.profiler: cProfile.Profile | None = None

    async def run(self, line: str) -> dict[str, Any]:
        word, *rest = line.split()
        if word == "burst":
            first, count, batch = map(int, rest)
            return await burst(self.engine, first, count, batch)
        if word == "pace":
            return await pace(self.engine, int(rest[0]), int(rest[1]), float(rest[2]))
        if word == "cpu":
            return {"cpu_ns": time.process_time_ns()}
        if word == "profile" and not rest:
            self.profiler = cProfile.Profile()
            self.profiler.enable()
            return {"profiling": True}
        if word == "profile" and self.profiler is not None:
            self.profiler.disable()
            self.profiler.dump_stats(rest[0])
            return {"profile": rest[0]}
        return {"error": f"unknown command {line!r}"}


async def serve(args: argparse.Namespace) -> None:
    config: dict[str, Any] = {
        "port": 0,
        "host": "127.0.0.1",
        "gc_freeze": True,
        "redis": args.redis,
        "namespace": args.namespace,
        "inbound": {"realm": "Benchmark", "username": "pusher", "password": "bench-pusher"},
        "outbound": {"timeout": 60.0},
        "middleware": {"log_interval": None},
        "webhooks": [
            {
                "url": args.url,
                "secret": args.secret,
                "events": [TYPE],
                "max_concurrency": args.max_concurrency,
            }
        ],
    }
    bow = chain(Bow(config))
    await bow.start()
    engine = bow._webhooks
    assert engine is not None
    commands = Commands(engine)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"port": bow.port, "pid": os.getpid()}), flush=True)
    try:
        while line := (await reader.readline()).decode().strip():
            print(json.dumps(await commands.run(line)), flush=True)
    finally:
        await bow.stop()


def chain(bow: Bow) -> Bow:
    """``bow`` with ``lib/gateway.py``'s middleware, inbound and outbound."""
    return (
        bow.middleware(version="v1.1", create_criteria_from_listener_details=criteria_from_claim())
        .inbound(
            path="/v1.2/messages",
            create_message_from_request_body=create_message_from_request_body,
            middleware_version="v1.1",
        )
        .outbound(
            version="v1.3",
            create_listener_details_from_token=JwtOutbound(secret=JWT_SECRET),
            middleware_version="v1.1",
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="a gateway with one webhook, for the benchmark")
    parser.add_argument("--url", required=True, help="the webhook's receiver")
    parser.add_argument("--secret", required=True, help="the webhook's whsec_ secret")
    parser.add_argument("--redis", help="a redis:// URL: the Redis store instead of memory")
    parser.add_argument("--namespace", default="bench")
    parser.add_argument("--max-concurrency", type=int, default=16)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="gateway: %(levelname)s %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
