"""Topic histories through Redis with an AOF (issue 15): retained messages accepted and delivered
end to end, a replay to one connection, and what a retained message and a topic cost in Redis.

Run:  .venv/bin/python bench/history_bench.py                     # the three parts, ~1.5 min
      .venv/bin/python bench/history_bench.py --rate 35000        # offered load paced at 35,000/s
      .venv/bin/python bench/history_bench.py --parts retain --duration 5 --quiet 0   # a quick look
      .venv/bin/python bench/history_bench.py --py-spy /tmp/gw.svg   # + py-spy of the gateway

A plain script, not a test. A private redis-server persists as a production one would
(``--appendonly yes --appendfsync everysec``, its AOF in a temporary directory on the machine's
disk); it and this process, the load generator, are pinned to CPU 1, and each part starts a fresh
gateway (``lib/gateway.py --envelope --history '[{"filter": "chat/#", ...}]'``: JWT outbound v1.3,
claims middleware, an inbound that takes envelopes or JSON lists of them, the Redis backplane)
pinned to CPU 0, with a namespace of its own on a flushed Redis. Messages are envelopes
``{"name": "chat/...", "payload": "<100 characters>", "audience": [{"room": 1}]}``; a
``[[history]]`` rule keeps ``chat/#``, so each one is one run of the backplane's RETAIN script.

1. **retain**: one lean Socket.IO protocol-2 websocket client (``lib.lean.websocket.LeanClient``,
   ``&proto=2``, criteria ``{"room": 1}``) subscribes; ``--posters`` aiohttp keep-alive
   connections POST batches of ``--batch`` (100) messages to ``chat/room1`` back to back (or
   paced at ``--rate`` messages/s in all). After ``--warmup`` s, ``--duration`` s are measured:
   messages accepted (answered ``204``) per second and messages delivered to the subscriber per
   second, end to end, with the latency of each delivery (each payload starts with the
   ``time.monotonic_ns()`` of its POST). Then the posters stop and the subscriber must receive
   everything accepted: every sequence from 1 to the last exactly once (``meta.sequence``), or
   the exit status is 1. CPU per core and per process (``/proc``), Redis's own figures for the
   window (``INFO commandstats``: calls and µs per call of ``EVALSHA`` and the others;
   ``INFO persistence``: AOF rewrites, delayed fsyncs) and the gateway's longest event-loop stall
   are printed.
2. **replay**: ``--fill`` (200,000) messages are POSTed to ``chat/replay`` (batches of 1,000),
   nobody connected; then one protocol-2 client connects and sends ``replay {"topic":
   "chat/replay", "start": 0}``, and again from the sequence after the last it got while the topic
   has more (one replay gives at most 100,000: ``topic_replay.MAX_COUNT``), timing each from the
   emit to its ack ``{"count": n}``; every sequence must come once, in order, with
   ``replayed: true``. Gateway CPU per replayed message (``CLOCK_PROCESS_CPUTIME_ID`` through
   ``lib/gateway.py``'s ``cpu``) and Redis's.
3. **memory**: ``INFO memory`` ``used_memory`` before and after ``--retained`` (100,000) messages
   of 100-byte payloads in one topic, per message; ``MEMORY USAGE ... SAMPLES 0`` of the topic's
   stream ``{ns}:topic:chat/memory`` per entry, and of the gateway's event stream ``{ns}:events``
   (every event, kept or not, trimmed to about ``backplane.max_len``, 100,000 by default) per
   entry, stated apart; then ``--topics`` (10,000) topics of one message each, and the same
   topics once their streams are trimmed to nothing (``XTRIM MAXLEN 0``, as ``max_age`` leaves
   a topic nobody wrote to lately): the cost of a topic, i.e. its key ``{ns}:topic:<topic>`` and
   its field in ``{ns}:sequences``.

The exit status is 1 when something was lost or duplicated, or a target of the issue was missed:
at least 35,000 messages/s accepted and delivered (batches of 100), at least 70,000 messages/s
replayed to one connection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from lib import machine
from lib.histories.memory import memory_part
from lib.histories.parts import parser_of
from lib.histories.replay import replay_part
from lib.histories.retain import retain_part
from lib.private_redis import RedisServer
from lib.variants import package_layout
from redis.asyncio import Redis


async def bench(args: argparse.Namespace, redis: RedisServer) -> bool:
    client = Redis.from_url(redis.url)
    ok = True
    try:
        if "retain" in args.parts:
            ok = await retain_part(args, redis, client) and ok
        if "replay" in args.parts:
            ok = await replay_part(args, redis, client) and ok
        if "memory" in args.parts:
            ok = await memory_part(args, redis, client) and ok
    finally:
        await client.aclose()
    return ok


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--parts", default="retain,replay,memory", help="which parts, in order")
    parser.add_argument("--duration", type=float, default=10.0, help="s measured (retain)")
    parser.add_argument("--warmup", type=float, default=3.0, help="s before measuring (retain)")
    parser.add_argument("--posters", type=int, default=4, help="concurrent POSTing connections")
    parser.add_argument("--batch", type=int, default=100, help="messages per POST (retain)")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="messages/s offered in all (0: back to back)"
    )
    parser.add_argument("--drain", type=float, default=60.0, help="s to wait for the backlog")
    parser.add_argument("--fill", type=int, default=200_000, help="messages to replay")
    parser.add_argument("--retained", type=int, default=100_000, help="messages (memory)")
    parser.add_argument("--topics", type=int, default=10_000, help="topics (memory)")
    parser.add_argument(
        "--max-count", type=int, default=1_000_000, help="the [[history]] rule's max_count"
    )
    parser.add_argument("--quiet", type=float, default=30.0, help="s to wait for a quiet machine")
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument(
        "--py-spy",
        metavar="FILE",
        help="py-spy record the gateway over the retain window (.svg flame graph, .json "
        "speedscope, .txt collapsed stacks), and over the replays (FILE with -replay)",
    )
    parser.add_argument(
        "--gateway",
        help="run another checkout's gateway (e.g. /tmp/bow-HEAD from `git archive`) rather "
        "than this working tree's",
    )
    parser.add_argument(
        "--pythonpath", help="a directory put first on the gateway's PYTHONPATH (e.g. hiredis)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = set(args.parts) - {"retain", "replay", "memory"}
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}")
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("two CPUs are needed: one for the gateway, one for the load generator")
    machine.raise_open_files_limit()
    print(machine.environment(["aiohttp", "redis", "orjson"]))
    workdir = tempfile.mkdtemp(prefix="history-bench-")
    args.source = None
    if args.gateway:
        layout = package_layout(Path(args.gateway), Path(workdir) / "gateway")
        args.source = str(layout)
        print(f"bow_gateway: {args.gateway} (--gateway)")
    else:
        print(f"bow_gateway: {machine.git_state()}")
    if args.pythonpath:
        print(
            f"the gateway's PYTHONPATH starts with {args.pythonpath}: {os.listdir(args.pythonpath)}"
        )
    print(f"the gateway's redis-py parser: {parser_of(args)}")
    os.sched_setaffinity(0, {args.client_cpu})
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with RedisServer(cpu=args.client_cpu, aof=True) as redis:
        print(
            f"redis-server {redis.version()} (private: pid {redis.pid}, port {redis.port}, "
            f"--appendonly yes --appendfsync everysec, AOF in {redis.dir}) and the load generator "
            f"(this process, pid {os.getpid()}) on CPU {args.client_cpu}"
        )
        gc.freeze()
        try:
            ok = asyncio.run(bench(args, redis))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nload average now: {machine.load_average()}")
    if not ok:
        print("FAILED: see above (a target missed, or messages lost)")
    return 0 if ok else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
