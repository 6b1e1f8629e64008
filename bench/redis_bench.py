"""Delivery through Redis: one instance in memory, one instance through Redis, two through Redis.

Run:  .venv/bin/python bench/redis_bench.py [--sockets 1000,10000] [--configs memory,redis,redis-x2]

A plain script, not a test. For every size in ``--sockets`` and every configuration in
``--configs`` it starts the gateway(s) afresh, opens that many python-socketio websocket clients
(authenticated with JWTs, criteria ``{"all": true, "g10": <every 10th>, "role": ...}`` as in
``delivery_bench.py``) and runs the phases of ``delivery_bench.py``:

- ``latency, 1 listener``: one message at a time to ``[{"__id": <random listener>}]``; with and
  without Redis, this is the latency the Redis hop adds;
- ``latency, everyone``: one message at a time to every socket;
- ``throughput, everyone`` / ``throughput, 10%``: back to back for ``--duration`` s, at most
  ``--window`` messages outstanding (outstanding until every targeted socket has received it).

Configurations:

- ``memory``: one ``lib/gateway.py``, in-process backplane (the baseline);
- ``redis``: one ``lib/gateway.py`` with the Redis backplane;
- ``redis-x2``: two instances sharing the Redis stream. ``--two ports`` (default): two
  ``lib/gateway.py`` processes on two ports; listener *j* of each load-generator process connects
  to port *j* mod 2 and the POSTs alternate between the two ports. ``--two workers``:
  ``python -m bow_gateway serve --workers 2`` (the embedded default configuration, through
  ``BOW_REDIS_URL``; one port shared with ``SO_REUSEPORT``, the kernel spreads the connections).

Redis is a private ``redis-server`` on a free port (``--save '' --appendonly no``), started here
and shut down at the end; it is flushed between configurations.

The load generator is this process (it POSTs with aiohttp and keeps the books) plus
``--clients-per-process``-sized load-generator processes (multiprocessing, spawn) that each open
their share of the clients (at most ``--connect-concurrency`` connections being opened in all)
and record, per receipt, the time from just before the POST to the client's handler
(``time.monotonic_ns()``, system-wide on Linux). A process tells this one when every socket of
its share that a message targets has received it; the latencies are merged at the end of each
phase. Nothing is pinned: with two CPUs, gateways, Redis and load generators share both; the CPU
columns say who used what (``other`` is every other process on the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from lib import machine
from lib.gateways import Gateways, controllable, start_bench_gateway, start_serve_workers
from lib.private_redis import RedisServer
from lib.sio_load import CONFIGS
from lib.sio_load.parent import run_config
from lib.sio_load.phases import Connected, Result
from lib.sio_load.report import print_config, print_summary


def start_gateways(
    config: str, redis: RedisServer | None, two: str, namespace: str, profile: str | None
) -> Gateways:
    if config == "redis-x2" and two == "workers":
        assert redis is not None
        return start_serve_workers(2, redis.url, namespace)
    count = 2 if config == "redis-x2" else 1
    redis_url = None if config == "memory" else (redis.url if redis else None)
    started = [
        start_bench_gateway(redis_url, namespace, f"{profile}.{k}" if profile else None)
        for k in range(count)
    ]
    urls = [f"http://127.0.0.1:{port}" for _, port, _ in started]
    backplane = "in-process backplane" if redis_url is None else "Redis backplane"
    gateways = controllable(
        f"{count} x lib/gateway.py ({backplane}) on port(s) "
        + ", ".join(str(port) for _, port, _ in started)
        + ", pid(s) "
        + ", ".join(str(pid) for _, _, pid in started),
        [process for process, _, _ in started],
        [pid for _, _, pid in started],
        urls,
    )
    gateways.profile = profile
    return gateways


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--sockets", default="1000", help="comma-separated numbers of websocket clients"
    )
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"comma-separated, among {', '.join(CONFIGS)}"
    )
    parser.add_argument(
        "--two",
        choices=("ports", "workers"),
        default="ports",
        help="redis-x2 as two lib/gateway.py on two ports, or as `serve --workers 2` on one port",
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per throughput phase")
    parser.add_argument("--window", type=int, default=4, help="messages outstanding (throughput)")
    parser.add_argument("--messages", type=int, default=1000, help="messages, 1-listener latency")
    parser.add_argument(
        "--broadcasts",
        type=int,
        help="messages, everyone latency (default: --broadcast-deliveries / sockets, at least 5)",
    )
    parser.add_argument(
        "--broadcast-deliveries",
        type=int,
        default=50_000,
        help="deliveries, everyone latency (unless --broadcasts)",
    )
    parser.add_argument(
        "--clients-per-process",
        type=int,
        default=2500,
        help="at most this many clients per load-generator process",
    )
    parser.add_argument(
        "--connect-concurrency", type=int, default=50, help="connections being opened, in all"
    )
    parser.add_argument("--drain", type=float, default=15.0, help="seconds to wait for stragglers")
    parser.add_argument(
        "--idle", type=float, default=3.0, help="seconds to measure the gateways idle, connected"
    )
    parser.add_argument(
        "--quiet",
        type=float,
        default=30.0,
        help="before each configuration, wait up to this many seconds for 3 quiet seconds "
        "(other processes under 10%% of a CPU)",
    )
    parser.add_argument(
        "--profile",
        metavar="PREFIX",
        help="cProfile the lib/gateway.py instances per phase (not with --two workers); "
        "stats go to PREFIX.<instance>.<config>.<sockets>.<phase>",
    )
    parser.add_argument(
        "--gateway-gc",
        choices=("default", "freeze", "off"),
        default="default",
        help="EXPERIMENT: once every client is connected, gc.collect() + gc.freeze() ('freeze') "
        "or gc.disable() ('off') in each lib/gateway.py (which runs with gc_freeze on, as serve "
        "does)",
    )
    parser.add_argument("--seed", type=int, default=1)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.profile:
        args.profile = str(Path(args.profile).resolve())
    sizes = [int(s.replace("_", "")) for s in args.sockets.split(",") if s]
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configuration(s): {', '.join(sorted(unknown))}")

    soft, hard = machine.raise_open_files_limit()
    need = max(sizes) + 1000
    if soft != resource.RLIM_INFINITY and soft < need:
        print(f"WARNING: RLIMIT_NOFILE is {soft} (hard {hard}): {max(sizes):,} sockets may not fit")
    print(machine.environment(["aiohttp", "python-socketio", "python-engineio", "PyJWT", "redis"]))
    print(f"bow_gateway: {machine.git_state()}")
    redis = RedisServer() if any(c != "memory" for c in configs) else None
    if redis is not None:
        print(
            f"redis-server {redis.version()} (private: port {redis.port}, pid {redis.pid}, "
            "no persistence)"
        )
    print(f"open files limit: {soft} (hard {hard}); nothing pinned")
    connects: list[Connected] = []
    results: list[Result] = []
    started = time.monotonic()
    try:
        for n in sizes:
            for config in configs:
                if redis is not None:
                    redis.flush()
                if args.quiet > 0:
                    machine.wait_for_quiet(args.quiet)
                gateways = start_gateways(
                    config, redis, args.two, f"bench{n}{config}", args.profile
                )
                print()
                print(f"== {config}, {n:,} sockets: {gateways.description}", flush=True)
                try:
                    connected, config_results = asyncio.run(
                        run_config(args, config, n, gateways, redis.pid if redis else None)
                    )
                finally:
                    gateways.stop()
                connects.append(connected)
                results.extend(config_results)
                print_config(config_results)
    finally:
        if redis is not None:
            redis.stop()
    print()
    print(
        "Summary (latency: POST start to the client's handler, per delivery; gateway CPU summed "
        "over instances):"
    )
    print_summary(connects, results)
    print(
        f"\nload average now: {machine.load_average()}; whole run "
        f"{time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
