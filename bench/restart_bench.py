"""Protocol 2 through Redis: 1,000 clients recovering at once after their instance restarted.

Run:  .venv/bin/python bench/restart_bench.py [--sockets 1000] [--before 10] [--missed 50]
      .venv/bin/python bench/restart_bench.py --source /path/to/checkout   # another gateway

A plain script, not a test (issue 13, "Done when" (c): every client recovers, and the gateway's
longest event-loop stall stays under 250 ms). It needs the Redis backplane's positions (the
history must outlive the instance): it starts a private ``redis-server``
(``lib/private_redis.py``: a free port, no persistence, never the shared one on 6379) pinned to
CPU 1, and ``lib/gateway.py --redis`` (JWT outbound v1.3, claims middleware, pass-through
inbound; recovery at its defaults) pinned to CPU 0; this process, the load generator, runs on
CPU 1. Then:

1. ``--sockets`` lean protocol-2 websocket clients (``lib.lean.recovering.RecoveringClient``:
   ``&proto=2``, ``authenticate`` with ``(token, {}, ack)``) connect, ``--connect-concurrency``
   at a time; listener *i* has the criteria ``{"all": true, "g10": i % 10 == 0, "role": ...}``;
2. ``--before`` messages (a mix: everyone, the 10% group, one listener) are POSTed one at a
   time; each client records the last position it received (``meta.position``);
3. the gateway is killed (SIGKILL: no 4012, no goodbye) and a new one started on the same port
   and the same Redis; the time until it serves is printed;
4. ``--missed`` more messages (the same mix) are POSTed to it while the clients are away;
5. every client reconnects **at once** (one ``create_connection`` each, all started together)
   with ``{"since": <its last position>}``. A client has recovered when its ack says
   ``recovered: true`` and it has read exactly the replayed events expected from its criteria,
   each with ``replayed: true``. One that could not connect (e.g. the handshake's ``503`` once
   over ``outbound.max_connects_per_second``) retries after ``--retry-after`` s, as a client
   following the advice would, at most ``--retries`` times;
6. printed: how many recovered (at the first attempt, and in all), the acks' reasons, the time
   until the last one had recovered (and the median), the gateway's longest event-loop stall
   and longest GC during the reconnection (``lib/gateway.py``'s 10 ms probe), its CPU time, and
   its recovery metrics.

The exit status is 1 when a client did not recover or the longest stall is over ``--target-ms``;
2 when the gateway cannot run it (no Redis backplane positions yet: the ack has no position).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lib import machine
from lib.fleet import (
    Fleet,
    Reconnection,
    plan,
    post_all,
    reconnect_all,
    recovered,
    targets,
    wait_for,
)
from lib.gateways import Gateways
from lib.lean.posters import Posters
from lib.private_redis import RedisServer
from lib.variants import Variant, source_variant, start_variant


@dataclass
class Restart:
    """The run: its options, the Redis and gateway (the second once restarted), the clients."""

    args: argparse.Namespace
    redis: RedisServer
    variant: Variant
    rng: random.Random
    gateways: Gateways
    port: int
    fleet: Fleet

    async def command(self, text: str) -> dict[str, Any]:
        return (await self.gateways.command(text))[0]


async def bench(args: argparse.Namespace, redis: RedisServer, workdir: str) -> int:
    rng = random.Random(args.seed)
    variant = source_variant(args.source, 2, workdir)
    try:
        gateways = start_variant(variant, redis, "restart")
    except SystemExit as error:
        print(
            f"CANNOT RUN: {error} with the Redis backplane (its traceback above; before the "
            "Redis backplane has positions, RedisBackplane cannot be instantiated)"
        )
        return 2
    machine.pin_gateway(gateways.pids[0], args.server_cpu)
    port = int(gateways.socket_urls[0].rsplit(":", 1)[1])
    print(f"gateway: {gateways.description}, pinned to CPU {args.server_cpu}", flush=True)
    fleet = Fleet(args.host, port, args.sockets)
    run = Restart(args, redis, variant, rng, gateways, port, fleet)
    try:
        if not await connect(run):
            return 2
        positions = await before_restart(run)
        if positions is None:
            return 2
        await restart(run)
        expected = await while_away(run)
        return await everyone_at_once(run, positions, expected)
    finally:
        fleet.close()
        run.gateways.stop()


async def connect(run: Restart) -> bool:
    """1. every client connects; False if this gateway has no protocol 2."""
    args, fleet = run.args, run.fleet
    semaphore = asyncio.Semaphore(args.connect_concurrency)

    async def first(i: int) -> None:
        async with semaphore:
            await fleet.open(i, {}, 0, 60)

    started = time.perf_counter()
    await asyncio.gather(*(first(i) for i in range(args.sockets)))
    print(
        f"connected and authenticated {args.sockets:,} protocol-2 sockets in "
        f"{time.perf_counter() - started:.2f} s",
        flush=True,
    )
    if not all(c is not None and isinstance(c.result, dict) for c in fleet.clients):
        print("CANNOT RUN: an ack without a result object: this gateway has no protocol 2")
        return False
    return True


async def before_restart(run: Restart) -> list[str | None] | None:
    """2. some messages, one at a time; each client keeps its last position (None: there are
    no positions)."""
    args, fleet = run.args, run.fleet
    posters = Posters(args.host, run.port)
    posters.grow(2)
    before = plan(args.before, args.sockets, run.rng)
    failed = await post_all(posters, before, "before")
    wanted = [sum(targets(i, s) for s in before) for i in range(args.sockets)]

    def all_received() -> bool:
        return all(
            c is not None and len(c.events) >= wanted[i] for i, c in enumerate(fleet.clients)
        )

    if not await wait_for(all_received, 30) or failed:
        print(f"WARNING: not every message was delivered before the restart ({failed} failed)")
    positions = [c.position if c is not None else None for c in fleet.clients]
    if not all(positions):
        print(
            f"CANNOT RUN: {positions.count(None)} clients received no position (e.g. events "
            f"{next(c.events for c in fleet.clients if c is not None and not c.position)}): "
            "this gateway's backplane gives none"
        )
        return None
    print(
        f"{args.before} messages before the restart ({sum(wanted):,} deliveries); every "
        f"client recorded its last position (e.g. {positions[0]!r})",
        flush=True,
    )
    return positions


async def restart(run: Restart) -> None:
    """3. kill the instance, start a new one on the same port and Redis."""
    for client in run.fleet.clients:
        if client is not None:
            client.books.closing = True
    killed = time.perf_counter()
    run.gateways.processes[0].kill()
    run.gateways.processes[0].wait()
    run.gateways = start_variant(run.variant, run.redis, "restart", ["--port", str(run.port)])
    machine.pin_gateway(run.gateways.pids[0], run.args.server_cpu)
    print(
        f"killed the gateway (SIGKILL) and started another on the same port and Redis: "
        f"serving after {time.perf_counter() - killed:.2f} s ({run.gateways.description})",
        flush=True,
    )
    lost = await wait_for(lambda: all(c is None or c.lost for c in run.fleet.clients), 10)
    if not lost:
        print("WARNING: some clients did not notice the restart within 10 s")


async def while_away(run: Restart) -> list[int]:
    """4. messages the clients miss; how many each client should get replayed."""
    args = run.args
    posters = Posters(args.host, run.port)
    posters.grow(2)
    missed = plan(args.missed, args.sockets, run.rng)
    failed = await post_all(posters, missed, "missed")
    expected = [sum(targets(i, s) for s in missed) for i in range(args.sockets)]
    print(
        f"{args.missed} messages while the clients were away ({failed} failed): "
        f"{sum(expected):,} replays expected, {min(expected)}-{max(expected)} per client",
        flush=True,
    )
    await asyncio.sleep(args.settle)
    return expected


def start_spy(run: Restart) -> subprocess.Popen[bytes]:
    """py-spy samples of the new gateway during the reconnection."""
    return subprocess.Popen(
        [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "-p",
            str(run.gateways.pids[0]),
            "-r",
            "1000",
            "-f",
            "raw",
            "-o",
            run.args.py_spy,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def everyone_at_once(run: Restart, positions: list[str | None], expected: list[int]) -> int:
    """5. every client reconnects at once with ``since``; 6. what came of it."""
    args, command = run.args, run.command
    spy = None
    if args.py_spy:  # sample the new gateway during the reconnection
        spy = start_spy(run)
        await asyncio.sleep(1.0)  # py-spy attaches
    await command("stall")
    await command("gc")
    cpu_before = (await command("cpu"))["cpu_ns"]
    done = await reconnect_all(args, run.fleet, positions, expected, run.rng)
    cpu_after = (await command("cpu"))["cpu_ns"]
    stall = (await command("stall"))["stall"]
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(30)
        print(f"py-spy samples (raw, collapsed stacks) of the reconnection: {args.py_spy}")
    figures = {
        "cpu": cpu_after - cpu_before,
        "stall": stall,
        "collections": (await command("gc"))["gc"],
        "counters": (await command("recoveries"))["recoveries"],
        "sockets": (await command("sockets"))["sockets"],
    }
    return report(args, done, expected, figures)


def report(
    args: argparse.Namespace, done: Reconnection, expected: list[int], figures: dict[str, Any]
) -> int:
    """6. how many recovered, how fast, what the gateway went through; the exit status."""
    reasons, count, first_try = recovered(done, expected)
    stall, collections, cpu = figures["stall"], figures["collections"], figures["cpu"]
    times = sorted(t for t in done.done_at if t is not None)
    print()
    print(
        f"reconnected {args.sockets:,} clients at once with since: {count:,} recovered "
        f"everything they missed, {first_try:,} at the first attempt "
        f"({sum(1 for t in done.done_at if t is not None):,} connected); "
        f"connection attempts: {dict(sorted(done.attempts.items()))} (attempt 0 = the first)"
    )
    print(f"  acks: {dict(reasons)}")
    if done.failures:
        print(f"  failed attempts: {dict(done.failures.most_common(5))}")
    if times:
        print(
            f"  time to recover, from the first connect: all {times[-1]:.2f} s, median "
            f"{statistics.median(times):.2f} s, first {times[0] * 1e3:.0f} ms (whole "
            f"reconnection {done.took:.2f} s)"
        )
    print(
        f"  the gateway meanwhile: longest event-loop stall "
        f"{stall['longest'] * 1e3:.0f} ms (10 ms probe, {stall['ticks']} ticks in "
        f"{stall['seconds']:.2f} s), longest GC {max(collections['longest']) * 1e3:.0f} ms "
        f"({collections['collections'][2]} full), CPU {cpu / 1e9:.2f} s "
        f"({cpu / 1e6 / args.sockets:.2f} ms per client); it counts "
        f"{figures['sockets']['authenticated']:,.0f} authenticated sockets"
    )
    print(f"  its recovery metrics: {figures['counters']}")
    all_recovered = count == args.sockets
    under = stall["longest"] * 1e3 < args.target_ms
    print(
        f"target: all {args.sockets:,} recover: {'ok' if all_recovered else 'NO'}; longest "
        f"stall {stall['longest'] * 1e3:.0f} ms < {args.target_ms:g} ms: "
        f"{'ok' if under else 'NO'}: " + ("MET" if all_recovered and under else "MISSED")
    )
    return 0 if all_recovered and under else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--sockets", type=int, default=1000)
    parser.add_argument("--before", type=int, default=10, help="messages before the restart")
    parser.add_argument("--missed", type=int, default=50, help="messages while away")
    parser.add_argument("--connect-concurrency", type=int, default=100, help="first connect")
    parser.add_argument("--retries", type=int, default=5)
    parser.add_argument("--retry-after", type=float, default=1.0, help="s, jittered up to 2x")
    parser.add_argument("--timeout", type=float, default=60.0, help="s, one reconnection")
    parser.add_argument("--settle", type=float, default=0.5, help="s after the missed messages")
    parser.add_argument("--target-ms", type=float, default=250.0)
    parser.add_argument("--source", help="another checkout's gateway (see fanout_bench.py)")
    parser.add_argument("--py-spy", help="py-spy the new gateway during the reconnection (file)")
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quiet", type=float, default=30.0, help="s to wait for a quiet machine")
    args = parser.parse_args(argv)

    machine.raise_open_files_limit()
    print(machine.environment(["aiohttp", "python-socketio", "python-engineio", "PyJWT", "redis"]))
    print(f"bow_gateway: {args.source or machine.git_state()}")
    os.sched_setaffinity(0, {args.client_cpu})
    if args.quiet > 0:
        machine.wait_for_quiet(args.quiet)
    with RedisServer(cpu=args.client_cpu) as redis:
        print(
            f"redis-server {redis.version()} (private: port {redis.port}, pid {redis.pid}, no "
            f"persistence, CPU {args.client_cpu}); this process on CPU {args.client_cpu}",
            flush=True,
        )
        with tempfile.TemporaryDirectory(prefix="restart-") as workdir:
            status = asyncio.run(bench(args, redis, workdir))
    print(f"load average now: {machine.load_average()}")
    return status


if __name__ == "__main__":
    sys.exit(main())
