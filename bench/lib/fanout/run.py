"""One L of ``fanout_bench.py``: connect every socket, run the phases, close them all at once."""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lib import proc, stats
from lib.fanout.phases import PHASE_KEYS, Phase, Result, Run, phases, run_phase
from lib.gateways import Gateways
from lib.lean.books import Books
from lib.lean.connect import open_clients
from lib.lean.posters import Posters
from lib.proc import Machine
from lib.variants import Variant


@dataclass
class Connected:
    sockets: int
    opened: int
    failures: list[str]
    wall: float
    gateway_cpu: float
    loadgen_cpu: float
    rss_before_kib: int
    rss_after_kib: int
    gateway_counts: dict[str, Any]  # what the gateway's metrics say once connected

    @property
    def rate(self) -> float:
        return self.opened / self.wall if self.wall > 0 else float("nan")

    @property
    def rss_per_socket_kib(self) -> float:
        return (self.rss_after_kib - self.rss_before_kib) / max(self.opened, 1)


async def connect(run: Run, args: argparse.Namespace) -> Connected:
    pid = run.gateways.pids[0]
    await asyncio.sleep(args.idle)
    rss_before = proc.rss_kib(pid)["VmRSS"]
    before = run.machine.snapshot()
    started = time.perf_counter()
    run.clients, failures = await open_clients(
        run.books,
        args.host,
        run.port,
        run.sockets,
        args.connect_concurrency,
        run.proto,
        protocol=run.protocol,
    )
    wall = time.perf_counter() - started
    used = Machine.delta(before, run.machine.snapshot())
    gc.collect()
    gc.freeze()  # this process's full collections stay out of the latencies
    await asyncio.sleep(args.idle)
    return Connected(
        sockets=run.sockets,
        opened=len(run.clients),
        failures=failures,
        wall=wall,
        gateway_cpu=float(sum(used["gateways"])),
        loadgen_cpu=used["loadgen"],
        rss_before_kib=rss_before,
        rss_after_kib=proc.rss_kib(pid)["VmRSS"],
        gateway_counts=(await run.gateway("sockets"))["sockets"],
    )


async def bench_one(
    args: argparse.Namespace,
    n: int,
    gateways: Gateways,
    redis_pid: int | None,
    proto: int = 1,
    protocol: str = "socketio",
    spy: str = "",
    receipt: int = 0,
) -> tuple[Connected, list[Result]]:
    books = Books()
    port = int(gateways.socket_urls[0].rsplit(":", 1)[1])
    run = Run(
        sockets=n,
        gateways=gateways,
        port=port,
        machine=Machine(gateways.pids, redis_pid, []),
        books=books,
        posters=Posters(args.host, port, receipt),
        cores=(args.server_cpu, args.client_cpu),
        proto=proto,
        protocol=protocol,
        spy=spy,
        spy_rate=args.py_spy_rate,
    )
    try:
        connected = await connect(run, args)
        print_connected(connected)
        results: list[Result] = []
        if not run.clients:
            return connected, results
        rng = random.Random(args.seed)
        warm_up = Phase("warm-up", lambda: b'[{"all":true}]', len(run.clients), 2, count=3)
        await run_phase(run, warm_up, args.drain)
        for phase in phases(args, len(run.clients), rng):
            if args.phases and PHASE_KEYS[phase.name] not in args.phases:
                continue
            result = await run_phase(run, phase, args.drain)
            results.append(result)
            print(
                f"  {phase.name}: {result.deliveries:,} deliveries, {result.rate_text()}",
                flush=True,
            )
        await disconnect_all(run)
        return connected, results
    finally:
        books.closing = True
        for client in run.clients:
            client.close()


async def disconnect_all(run: Run, limit: float = 120.0) -> None:
    """Close every socket at once from the client side; time the gateway's bookkeeping of it."""
    await run.gateway("stall")
    await run.gateway("gc")
    started = time.perf_counter()
    run.books.closing = True
    for client in run.clients:
        client.close()
    left = run.sockets
    while left > 0 and time.perf_counter() - started < limit:
        await asyncio.sleep(0.05)
        left = (await run.gateway("sockets"))["sockets"]["connected"]
    took = time.perf_counter() - started
    stall = (await run.gateway("stall"))["stall"]["longest"]
    collections = (await run.gateway("gc"))["gc"]
    print(
        f"  closed the {len(run.clients):,} sockets at once from the client side: the gateway "
        f"counted them all disconnected after {took:.2f} s ({left:,.0f} left); meanwhile its "
        f"longest event-loop stall was {stats.human_ns(stall * 1e9)}, its cyclic GC took "
        f"{sum(collections['seconds']):.2f} s ({collections['collections'][2]} full "
        f"collections, longest {stats.human_ns(max(collections['longest']) * 1e9)})",
        flush=True,
    )


def print_connected(c: Connected) -> None:
    print(
        f"  connected and authenticated {c.opened:,} of {c.sockets:,} sockets in {c.wall:.2f} s "
        f"({c.rate:,.0f}/s); gateway CPU {c.gateway_cpu * 1e3 / max(c.opened, 1):.2f} ms, load "
        f"generator CPU {c.loadgen_cpu * 1e3 / max(c.opened, 1):.2f} ms per connection; gateway "
        f"RSS idle {c.rss_before_kib / 1024:,.0f} MiB -> {c.rss_after_kib / 1024:,.0f} MiB "
        f"({c.rss_per_socket_kib:,.1f} KiB per connection); the gateway counts "
        f"{c.gateway_counts['connected']:,.0f} connected, "
        f"{c.gateway_counts['authenticated']:,.0f} authenticated",
        flush=True,
    )
    if c.failures:
        print(f"  WARNING: {len(c.failures)} sockets could not connect; first: {c.failures[0]}")


def spy_prefix(directory: str | None, n: int, variant: Variant, round_: int) -> str:
    """Where ``--py-spy`` puts this run's profiles: ``DIR/{L}-{variant}-r{round}``."""
    if not directory:
        return ""
    name = re.sub(r"[^A-Za-z0-9]+", "-", variant.name).strip("-")
    return str(Path(directory) / f"{n}-{name}-r{round_ + 1}")
