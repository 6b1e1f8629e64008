"""Fan-out benchmark: L lean websocket clients, audiences of 1 listener, 10% and 100%.

Run:  .venv/bin/python bench/fanout_bench.py [--sockets 1000,10000] [--duration 30] [--redis]
      .venv/bin/python bench/fanout_bench.py --sockets 1000 --duration 5 --short-duration 3

A plain script, not a test. For every L in ``--sockets`` it starts a fresh gateway
(``lib/gateway.py``: JWT outbound v1.3, claims middleware, pass-through inbound on /v1.2/messages,
the in-process backplane, or with ``--redis`` the Redis backplane on a private redis-server),
pinned to CPU 0 with ``taskset``; this process, the load generator, pins itself (and the
redis-server) to CPU 1. It opens L websocket connections with a Socket.IO client of its own,
written on asyncio Protocols (no python-socketio: this one costs a few µs per received frame):
HTTP upgrade to ``/socket.io/?EIO=4&transport=websocket&v=v1.3``, Engine.IO OPEN, Socket.IO
CONNECT ``40``, ``420["authenticate", <JWT>]`` and its ack ``430[]``; it answers pings and masks
its frames. ``--protocol`` picks other clients, as lean, for the same gateway and audiences:
``flywheel`` (a plain websocket on ``/broker?v=v1.3``: ``B {"auth": {"type": "Bearer", "token":
<JWT>}, "subscribe": ["bench"]}``, then ``R bench {body}`` frames) and ``sse`` (``GET
/events?v=v1.3`` over raw HTTP/1.1 with ``Authorization: Bearer <JWT>``, then the chunked
``text/event-stream``, one event a chunk); ``--protocol socketio,flywheel,sse --rounds 3`` runs
them interleaved and prints each one's CPU per delivery against Socket.IO's, round by round.
``--receipt 0,60`` runs each of them twice a round, without and with ``Bow-Receipt: 60`` on every
POST (section 17 of the feedback contract): a protocol-2 client then answers each event that
carries an acknowledgement id with ``43<id>[]`` (its guard's 20 packets a second raised for it).
Listener i has the criteria ``{"all": true, "g10": i % 10 == 0, "role": ...}`` as in
``delivery_bench.py``. Then these phases, POSTed to the inbound over keep-alive connections:

- light load (one message in flight: the next is POSTed once every recipient has the last):
  ``[{"__id": <random>}]`` (1 listener), ``[{"g10": true}]`` (10%), ``[{"all": true}]`` (100%);
- saturation (back to back, at most ``--window`` messages outstanding, i.e. not yet received by
  every recipient; ``--window-one`` for 1 listener): the same three audiences, for
  ``--short-duration`` s (1 listener, 10%) and ``--duration`` s (100%).

Every message body carries its sequence number and ``time.monotonic_ns()`` taken just before its
POST; all recipients receive identical bytes, so each distinct frame is parsed once (a dict keyed
by the frame's bytes) and every receipt costs a dict look-up and an ``array.append`` of its
latency (POST start to the client's ``data_received``, per delivery; CLOCK_MONOTONIC is
system-wide). Per phase: deliveries/s (first POST to last receipt), p50/p99, the gateway's CPU
per delivery and per message (utime + stime from /proc/<pid>/stat, 10 ms ticks), the load
generator's own CPU (when it nears 100% it, not the gateway, is the bottleneck), sockets dropped
(seen closing by the clients; disconnects counted by the gateway's metrics), and the gateway's
longest event-loop stall (``lib/gateway.py``'s ``stall`` probe: a 10 ms timer's worst lateness) and
longest garbage collection; and how busy each of the two cores was (/proc/stat, softirq included).
Before the phases: the connect+authenticate rate and the gateway's RSS per connection (idle,
before and after connecting); after them, every socket is closed at once from the client side,
and the time the gateway takes to count them disconnected (and its stall meanwhile) is printed.
For L = 10,000 it checks the target of the issue: 100% audience,
30 s back to back, no socket dropped, longest stall under 100 ms, p99 under 1 s. The exit status
is 1 when a socket was dropped (or could not connect).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from lib import machine
from lib.fanout.phases import PHASE_KEYS, Result
from lib.fanout.report import (
    check_target,
    print_comparison,
    print_medians,
    print_results,
    print_summary,
)
from lib.fanout.run import Connected, bench_one, spy_prefix
from lib.lean.connect import PROTOCOLS
from lib.private_redis import RedisServer
from lib.variants import Variant, start_variant, variants


def run_size(
    args: argparse.Namespace,
    n: int,
    redis: RedisServer | None,
    variant: Variant,
    round_: int,
) -> tuple[Connected, list[Result]]:
    if redis is not None:
        redis.flush()
    if args.quiet > 0:
        machine.wait_for_quiet(args.quiet)
    gateways = start_variant(variant, redis, f"fanout{n}")
    machine.pin_gateway(gateways.pids[0], args.server_cpu)
    print()
    print(
        f"== {n:,} sockets: {gateways.description}, pinned to CPU {args.server_cpu}; load "
        f"average {machine.load_average()}",
        flush=True,
    )
    try:
        connected, results = asyncio.run(
            bench_one(
                args,
                n,
                gateways,
                redis.pid if redis else None,
                variant.proto,
                variant.protocol,
                spy_prefix(args.py_spy, n, variant, round_),
                variant.receipt,
            )
        )
    finally:
        gateways.stop()
    if results:
        print(
            f"{n:,} listeners ({sum(1 for i in range(connected.opened) if i % 10 == 0):,} in "
            "the 10% group). Latency: POST start to the client's data_received, per delivery. "
            "CPU: CPU s / wall s (100% = one CPU)."
        )
        print_results(n, results)
        check_target(n, results)
    return connected, results


def add_variant_options(parser: argparse.ArgumentParser) -> None:
    """Which gateways and clients run (``lib/variants.py``'s variants)."""
    parser.add_argument(
        "--proto",
        default="1",
        help="Socket.IO protocols of the clients of this checkout's gateway, e.g. 1,2 to "
        "compare them",
    )
    parser.add_argument(
        "--protocol",
        default="socketio",
        help="wire protocols of the clients of this checkout's gateway, comma-separated among "
        + ", ".join(PROTOCOLS)
        + " (socketio: in each --proto)",
    )
    parser.add_argument(
        "--gateway",
        help="the gateway whose clients speak --proto: another checkout's (e.g. /tmp/bow-HEAD "
        "from `git archive`) rather than this working tree's",
    )
    parser.add_argument(
        "--source",
        action="append",
        help="also run another checkout's gateway (Socket.IO in --source-proto), e.g. "
        "/tmp/bow-5bc2fea from `git archive`; repeatable",
    )
    parser.add_argument(
        "--source-proto", default="1", help="Socket.IO protocols of the --source gateways' clients"
    )
    parser.add_argument(
        "--receipt",
        default="0",
        help="comma-separated modes of this checkout's (or --gateway's) clients, run as variants "
        "in turn: S (1-3600) POSTs with `Bow-Receipt: S`, each event asking for an ACK answered "
        "by every socket; 0 without (e.g. 0,60 compares them)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--sockets", default="1000,10000", help="comma-separated values of L")
    parser.add_argument("--duration", type=float, default=30.0, help="s, saturation at 100%%")
    parser.add_argument(
        "--short-duration", type=float, default=10.0, help="s, saturation at 1 listener and 10%%"
    )
    parser.add_argument("--window", type=int, default=4, help="outstanding messages, 10%%/100%%")
    parser.add_argument("--window-one", type=int, default=64, help="outstanding, 1 listener")
    parser.add_argument("--light-one", type=int, default=1000, help="messages, light 1 listener")
    parser.add_argument("--light-group", type=int, default=200, help="messages, light 10%%")
    parser.add_argument("--light-all", type=int, default=30, help="messages, light 100%%")
    parser.add_argument("--connect-concurrency", type=int, default=100)
    parser.add_argument("--drain", type=float, default=15.0, help="s to wait for stragglers")
    parser.add_argument("--idle", type=float, default=2.0, help="s idle before reading RSS")
    parser.add_argument(
        "--quiet", type=float, default=30.0, help="s to wait for a quiet machine before each L"
    )
    parser.add_argument("--redis", action="store_true", help="the Redis backplane (private)")
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--seed", type=int, default=1)
    add_variant_options(parser)
    parser.add_argument(
        "--phases",
        default="",
        help="only these phases (comma-separated among " + ", ".join(PHASE_KEYS.values()) + ")",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the variants (gateway, protocol) this many times each, interleaved, for each L",
    )
    parser.add_argument(
        "--py-spy",
        metavar="DIR",
        help="profile the gateway during each phase with py-spy (pip install py-spy), raw "
        "collapsed stacks in DIR/{L}-{variant}-r{round}-{phase}.txt; it inflates the CPU figures",
    )
    parser.add_argument(
        "--max-other",
        type=float,
        help="%% of a CPU: the medians over the rounds leave out the phases during which other "
        "processes used more",
    )
    parser.add_argument("--py-spy-rate", type=int, default=250, help="py-spy samples per second")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.py_spy:
        Path(args.py_spy).mkdir(parents=True, exist_ok=True)
    args.phases = [p for p in args.phases.split(",") if p]
    unknown = set(args.phases) - set(PHASE_KEYS.values())
    if unknown:
        parser.error(f"unknown phases {sorted(unknown)}")
    args.protocol = [p for p in args.protocol.split(",") if p]
    if set(args.protocol) - set(PROTOCOLS):
        parser.error(f"unknown protocols {sorted(set(args.protocol) - set(PROTOCOLS))}")
    sizes = [int(s.replace("_", "")) for s in args.sockets.split(",") if s]

    soft, hard = machine.raise_open_files_limit()
    if soft != resource.RLIM_INFINITY and soft < max(sizes) + 100:
        print(f"WARNING: RLIMIT_NOFILE is {soft} (hard {hard}): {max(sizes):,} sockets won't fit")
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("two CPUs are needed: one for the gateway, one for the load generator")
    print(machine.environment(["aiohttp", "python-socketio", "python-engineio", "PyJWT", "redis"]))
    print(f"bow_gateway: {machine.git_state()}")
    os.sched_setaffinity(0, {args.client_cpu})
    redis = RedisServer(cpu=args.client_cpu) if args.redis else None
    backplane = (
        f"Redis (private redis-server {redis.version()}, pid {redis.pid}, on CPU {args.client_cpu})"
        if redis
        else "in-process"
    )
    print(
        f"backplane: {backplane}; load generator (this process, pid {os.getpid()}) on CPU "
        f"{args.client_cpu}; open files limit {soft}"
    )
    runs = []
    names = []
    keys: list[tuple[int, int, Variant]] = []
    with tempfile.TemporaryDirectory(prefix="fanout-") as workdir:
        tried = variants(args, workdir)
        for variant in tried:
            if variant.source:
                print(f"{variant.name}: bow_gateway from {variant.source}")
        try:
            for n in sizes:
                for round_ in range(args.rounds):
                    for variant in tried:
                        runs.append(run_size(args, n, redis, variant, round_))
                        names.append(variant.name)
                        keys.append((n, round_, variant))
        finally:
            if redis is not None:
                redis.stop()
    print()
    print("Summary (latency p50 / p99 per delivery; saturation = back to back):")
    print_summary(runs, names)
    if len(tried) > 1:
        print()
        print_comparison(runs, keys, tried)
    if len(tried) > 1 or args.rounds > 1:
        print()
        print_medians(runs, keys, tried, args.max_other)
    dropped = sum(r.dropped + sum(r.gateway_drops.values()) for _, rs in runs for r in rs)
    failed = sum(len(c.failures) for c, _ in runs)
    print(f"\nload average now: {machine.load_average()}")
    if dropped or failed:
        print(f"FAILED: {dropped:.0f} sockets dropped, {failed} could not connect")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
