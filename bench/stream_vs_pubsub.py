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
import logging
import os
import sys
from collections.abc import Sequence

from lib import machine
from lib.private_redis import RedisServer
from lib.pubsub.carriers import VARIANTS
from lib.pubsub.measure import measure
from lib.pubsub.report import report


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
    print(machine.environment(["redis"]))
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
                machine.wait_for_quiet(args.quiet)
            results.append(asyncio.run(measure(name, redis, args)))
    report(results, args)
    print(f"\nload average now: {machine.load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
