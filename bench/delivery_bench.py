"""End-to-end delivery benchmark: POST messages to a real gateway, receive them on real sockets.

Run:  .venv/bin/python bench/delivery_bench.py [--listeners 1000] [--duration 5] [--window 8]

A plain script, not a test. The gateway (``bench/lib/gateway.py``: JWT outbound, claims middleware,
pass-through inbound, in-process backplane) runs in a process of its own, pinned to CPU 0 with
``taskset`` when there are two CPUs or more; this process, the load generator, pins itself to
CPU 1. It opens ``--listeners`` python-socketio ``AsyncClient`` websocket connections, each
authenticated with its own JWT (every 10th listener has ``g10: true``, everyone has
``all: true``), then runs these phases:

- ``latency, 1 listener``: one message at a time to ``[{"__id": <random listener>}]``;
- ``latency, everyone``: one message at a time to every listener (the time to reach all of them);
- ``throughput, everyone`` / ``throughput, 10%``: messages back to back for ``--duration``
  seconds, at most ``--window`` messages outstanding (a message is outstanding until every
  socket it targets has received it, so the load generator never runs ahead of delivery).

Latency is measured from just before the POST to the moment a client's handler runs; the body
carries ``time.monotonic_ns()``. Sender and receivers both live in this process, and
CLOCK_MONOTONIC is system-wide on Linux anyway. With ~1,000 python clients on one core the load
generator is usually the bottleneck, so the table also gives the gateway's own CPU time (utime +
stime from /proc/<pid>/stat) per delivery, which does not depend on how fast the clients read.
The load generator freezes its garbage collector's view of the connected clients (``gc.freeze()``)
so that its own full collections stay out of the latencies; the gateway runs untouched.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import socketio
from lib import gateway, machine, proc, stats
from lib.delivery import Phase, Result, close_clients, open_clients, run_phase
from lib.gateways import start_pinned, stop_process
from lib.listeners import criteria, listener_id


def result_row(result: Result) -> list[str]:
    tracker = result.tracker
    median, p99, _, _ = stats.summary(tracker.latencies)
    deliveries = tracker.deliveries
    missing = sum(entry[0] for entry in tracker.pending.values())
    return [
        result.phase.name,
        str(result.phase.window),
        f"{result.messages:,}",
        f"{deliveries:,}" + (f" ({missing:,} missing)" if missing else ""),
        f"{result.wall:.2f}",
        f"{deliveries / result.wall:,.0f}" if result.wall > 0 else "-",
        stats.human_ns(median),
        stats.human_ns(p99),
        stats.human_ns(stats.summary(tracker.post_times)[0]),
        f"{100 * result.server_cpu / result.wall:.0f}%" if result.wall > 0 else "-",
        f"{100 * result.server_sys / result.server_cpu:.0f}%" if result.server_cpu else "-",
        f"{result.server_cpu * 1e6 / deliveries:.1f}" if deliveries else "-",
        f"{result.server_cpu * 1e6 / result.messages:.0f}" if result.messages else "-",
        f"{100 * result.loadgen_cpu / result.wall:.0f}%" if result.wall > 0 else "-",
        f"{100 * result.other_cpu / result.wall:.0f}%" if result.wall > 0 else "-",
    ]


HEADERS = [
    "phase",
    "window",
    "messages",
    "deliveries",
    "wall s",
    "deliveries/s",
    "p50",
    "p99",
    "POST p50",
    "server CPU",
    "of which sys",
    "server µs/delivery",
    "server µs/message",
    "loadgen CPU",
    "other CPU",
]


async def collect_profile(path: str, phase: str) -> str | None:
    """Wait for the gateway to write its stats, then keep them under a name for this phase."""
    for _ in range(100):
        await asyncio.sleep(0.05)
        if os.path.exists(path):  # written whole: the gateway renames it into place
            target = f"{path}.{phase.replace(',', '').replace('%', 'pc').replace(' ', '-')}"
            os.replace(path, target)
            return target
    print(f"no profile written for phase {phase!r}")
    return None


async def connect(
    args: argparse.Namespace, base: str, server_pid: int
) -> list[socketio.AsyncClient]:
    n = args.listeners
    rss_idle = proc.rss_kib(server_pid)["VmRSS"]
    cpu_before = proc.cpu_seconds(server_pid)
    started = time.perf_counter()
    clients = await open_clients(base, n, args.connect_concurrency)
    connect_wall = time.perf_counter() - started
    # Keep the load generator's own full collections (1,000 clients are many objects) out of
    # the latencies: what exists now is never scanned again. The gateway is left as it is.
    gc.collect()
    gc.freeze()
    connect_cpu = proc.cpu_seconds(server_pid) - cpu_before
    rss_connected = proc.rss_kib(server_pid)["VmRSS"]
    print(
        f"connected and authenticated {n:,} websocket clients in {connect_wall:.1f} s "
        f"({n / connect_wall:,.0f}/s); gateway CPU {connect_cpu * 1e3 / n:.2f} ms per connection; "
        f"gateway RSS {rss_idle / 1024:,.0f} MiB idle -> {rss_connected / 1024:,.0f} MiB "
        f"({(rss_connected - rss_idle) / n:,.0f} KiB per connection)"
    )
    print()
    return clients


def phases_of(args: argparse.Namespace, in_group: int, rng: random.Random) -> list[Phase]:
    n = args.listeners
    return [
        Phase(
            "latency, 1 listener",
            lambda seq: ([{"__id": listener_id(rng.randrange(n))}], 1),
            window=1,
            count=args.messages,
        ),
        Phase(
            "latency, everyone",
            lambda seq: ([{"all": True}], n),
            window=1,
            count=args.broadcasts,
        ),
        Phase(
            "throughput, everyone",
            lambda seq: ([{"all": True}], n),
            window=args.window,
            duration=args.duration,
        ),
        Phase(
            "throughput, 10%",
            lambda seq: ([{"g10": True}], in_group),
            window=args.window,
            duration=args.duration,
        ),
    ]


async def run_phases(
    args: argparse.Namespace, base: str, server_pid: int, phases: list[Phase]
) -> list[Result]:
    n = args.listeners
    results = []
    connector = aiohttp.TCPConnector(limit=max(args.window, 1) * 2)
    async with aiohttp.ClientSession(connector=connector) as session:
        url = f"{base}{gateway.PATH}"
        # warm up both sides (first requests, first deliveries)
        await run_phase(
            Phase("warm-up", lambda seq: ([{"all": True}], n), window=2, count=5),
            session,
            url,
            server_pid,
            args.drain,
        )
        for phase in phases:
            if args.profile:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(args.profile)
                os.kill(server_pid, signal.SIGUSR1)
            result = await run_phase(phase, session, url, server_pid, args.drain)
            if args.profile:
                os.kill(server_pid, signal.SIGUSR2)
                result.profile = await collect_profile(args.profile, phase.name)
            results.append(result)
            print(f"  {phase.name}: {result.tracker.deliveries:,} deliveries", flush=True)
    return results


def print_results(args: argparse.Namespace, in_group: int, results: list[Result]) -> None:
    print()
    print(
        f"{args.listeners:,} listeners ({in_group:,} in the 10% group). Latency: POST start to "
        "the client's handler, per delivery.\nCPU columns: CPU seconds / wall seconds (100% = "
        "one CPU busy); 'other' is every other process on the machine.\nCPU times come from "
        "/proc in 10 ms ticks: short phases are coarse."
        + (
            " The gateway ran under cProfile (its CPU figures are inflated)."
            if args.profile
            else ""
        )
    )
    print(stats.table(HEADERS, [result_row(r) for r in results]))
    busiest = max((100 * r.other_cpu / r.wall for r in results if r.wall >= 0.5), default=0)
    if busiest > 10:
        print(
            f"WARNING: other processes used up to {busiest:.0f}% of a CPU during a phase; "
            "the figures are disturbed (the machine has 2 CPUs)"
        )
    late = sum(r.tracker.late for r in results)
    errors = sum(r.tracker.errors for r in results)
    if late or errors:
        print(f"late or duplicate receipts: {late}, failed POSTs: {errors}")
    print()


async def bench(args: argparse.Namespace, port: int, server_pid: int) -> list[Result]:
    base = f"http://127.0.0.1:{port}"
    in_group = sum(1 for i in range(args.listeners) if criteria(i)["g10"])
    rng = random.Random(args.seed)
    clients = await connect(args, base, server_pid)
    results = await run_phases(args, base, server_pid, phases_of(args, in_group, rng))
    print_results(args, in_group, results)
    started = time.perf_counter()
    await close_clients(clients, args.connect_concurrency)
    print(f"disconnected the clients in {time.perf_counter() - started:.1f} s")
    return results


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--listeners", type=int, default=1_000, help="websocket clients to open")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per throughput phase")
    parser.add_argument("--window", type=int, default=4, help="messages outstanding (throughput)")
    parser.add_argument("--messages", type=int, default=500, help="messages, 1-listener latency")
    parser.add_argument("--broadcasts", type=int, default=50, help="messages, everyone latency")
    parser.add_argument("--connect-concurrency", type=int, default=50)
    parser.add_argument("--drain", type=float, default=15.0, help="seconds to wait for stragglers")
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave both processes unpinned (pin=%(default)s)",
    )
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="cProfile the gateway in each phase; write the stats to FILE.<phase> and print them",
    )
    parser.add_argument("--profile-lines", type=int, default=20, help="rows of each profile")
    parser.add_argument(
        "--dump", metavar="FILE", help="write every phase's raw latencies (ns) to FILE as JSON"
    )
    parser.add_argument("--seed", type=int, default=1)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.profile:
        args.profile = str(Path(args.profile).resolve())

    can_pin = hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2
    args.pin = args.pin and can_pin and shutil.which("taskset") is not None
    print(machine.environment(["aiohttp", "python-socketio", "python-engineio", "PyJWT"]))
    process, port, pid = start_pinned(args.profile, args.pin, args.server_cpu)
    if args.pin:
        os.sched_setaffinity(0, {args.client_cpu})
        print(
            f"gateway pid {pid} pinned to CPU {args.server_cpu}, load generator to CPU "
            f"{args.client_cpu}"
        )
    else:
        print(f"gateway pid {pid}, not pinned")
    try:
        results = asyncio.run(bench(args, port, pid))
    finally:
        stop_process(process)
    if args.dump:
        with open(args.dump, "w", encoding="utf-8") as dump:
            json.dump(
                {
                    r.phase.name: {"latency": r.tracker.latencies, "post": r.tracker.post_times}
                    for r in results
                },
                dump,
            )
    for result in results:
        if result.profile:
            import pstats

            print(f"gateway profile of phase {result.phase.name!r} ({result.profile}):")
            profiled = pstats.Stats(result.profile)
            profiled.sort_stats("tottime").print_stats(args.profile_lines)
            profiled.sort_stats("cumulative").print_stats(args.profile_lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
