"""This process's side of ``redis_bench.py``'s load generators: start them, have them connect
their clients, then run the phases through them."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import random
import tempfile
import time
from typing import Any

import aiohttp

from lib import proc
from lib.gateways import Gateways
from lib.proc import Machine
from lib.sio_load.child import loadgen_main
from lib.sio_load.phases import Connected, Loadgen, Phase, PhaseRunner, Result, Tracker
from lib.sio_load.report import gc_text


async def run_config(
    args: argparse.Namespace, config: str, n: int, gateways: Gateways, redis_pid: int | None
) -> tuple[Connected, list[Result]]:
    processes = max(1, math.ceil(n / args.clients_per_process))
    rng = random.Random(args.seed)
    loadgens: dict[int, Loadgen] = {}
    hello = asyncio.get_running_loop().create_future()
    tracker_box: list[Tracker] = [Tracker()]

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = json.loads(await reader.readline())
        loadgen = loadgens[first["index"]]
        loadgen.pid, loadgen.writer = first["pid"], writer
        if all(lg.writer is not None for lg in loadgens.values()) and not hello.done():
            hello.set_result(None)
        while line := await reader.readline():
            if line.startswith(b"D "):
                tracker_box[0].done(int(line[2:]))
            else:
                await loadgen.replies.put(json.loads(line))

    with tempfile.TemporaryDirectory(prefix="bow-bench-") as folder:
        path = os.path.join(folder, "loadgen.sock")
        server = await asyncio.start_unix_server(accept, path, limit=1 << 26)
        context = multiprocessing.get_context("spawn")
        for index in range(processes):
            process = context.Process(
                target=loadgen_main, args=(path, index, processes), daemon=True
            )
            process.start()
            loadgens[index] = Loadgen(index, process)
        await asyncio.wait_for(hello, 60)
        try:
            return await _run_config(
                args, config, n, gateways, redis_pid, list(loadgens.values()), tracker_box, rng
            )
        finally:
            for loadgen in loadgens.values():
                with contextlib.suppress(Exception):
                    loadgen.send({"op": "close"})
            for loadgen in loadgens.values():
                await asyncio.get_running_loop().run_in_executor(None, loadgen.process.join, 10)
                if loadgen.process.is_alive():
                    loadgen.process.kill()
            server.close()


async def _run_config(
    args: argparse.Namespace,
    config: str,
    n: int,
    gateways: Gateways,
    redis_pid: int | None,
    loadgens: list[Loadgen],
    tracker_box: list[Tracker],
    rng: random.Random,
) -> tuple[Connected, list[Result]]:
    machine = Machine(gateways.pids, redis_pid, [lg.pid for lg in loadgens])
    connected, answers = await connect_all(args, config, n, gateways, loadgens, machine)
    await after_connect(args, gateways, machine, connected)
    if connected.failures:
        first = next(a["failure"] for a in answers if a["failure"])
        print(f"  WARNING: {connected.failures} clients could not connect; first error: {first}")
    if connected.opened == 0:
        return connected, []

    connector = aiohttp.TCPConnector(limit=max(args.window, 1) * 2 * len(gateways.post_urls))
    phases = [
        Phase("latency, 1 listener", "id", 1, count=args.messages),
        Phase(
            "latency, everyone",
            "all",
            1,
            count=args.broadcasts or max(5, args.broadcast_deliveries // n),
        ),
        Phase("throughput, everyone", "all", args.window, duration=args.duration),
        Phase("throughput, 10%", "g10", args.window, duration=args.duration),
    ]
    results = []
    async with aiohttp.ClientSession(connector=connector) as session:
        runner = PhaseRunner(
            args, config, n, gateways, loadgens, tracker_box, rng, machine, session
        )
        await runner.run(Phase("warm-up", "all", 2, count=3))
        for phase in phases:
            result = await runner.run(phase)
            results.append(result)
            print(f"    {phase.name}: {result.deliveries:,} deliveries", flush=True)
    return connected, results


async def connect_all(
    args: argparse.Namespace,
    config: str,
    n: int,
    gateways: Gateways,
    loadgens: list[Loadgen],
    machine: Machine,
) -> tuple[Connected, list[dict[str, Any]]]:
    """Every load generator opens its share of the clients; what it cost."""
    rss_idle = sum(proc.rss_kib(pid)["VmRSS"] for pid in gateways.pids)
    await gateways.command("gc")
    per_process = max(1, args.connect_concurrency // len(loadgens))
    before = machine.snapshot()
    started = time.perf_counter()
    for loadgen in loadgens:
        loadgen.send(
            {
                "op": "connect",
                "n": n,
                "urls": gateways.socket_urls,
                "concurrency": per_process,
                "secret": gateways.secret,
                "version": gateways.version,
            }
        )
    answers = [await loadgen.reply("connected") for loadgen in loadgens]
    wall = time.perf_counter() - started
    used = Machine.delta(before, machine.snapshot())
    for loadgen, answer in zip(loadgens, answers, strict=True):
        loadgen.n, loadgen.g10 = answer["n"], answer["g10"]
    opened = sum(lg.n for lg in loadgens)
    rss = sum(proc.rss_kib(pid)["VmRSS"] for pid in gateways.pids)
    connected = Connected(
        config=config,
        sockets=n,
        opened=opened,
        wall=wall,
        gateway_cpu=sum(used["gateways"]),
        redis_cpu=used["redis"],
        loadgen_cpu=used["loadgen"],
        gateway_rss_kib=rss - rss_idle,
        loadgen_rss_kib=sum(a["rss_kib"] for a in answers),
        processes=len(loadgens),
        failures=sum(a["failures"] for a in answers),
        gc=[a["gc"] for a in await gateways.command("gc")],
    )
    print(
        f"  connected and authenticated {opened:,} of {n:,} websocket clients in {wall:.1f} s "
        f"({opened / wall:,.0f}/s) from {len(loadgens)} load-generator process(es), "
        f"{args.connect_concurrency} connections opened at a time in all; gateway CPU "
        f"{connected.gateway_cpu * 1e3 / max(opened, 1):.2f} ms per connection, Redis CPU "
        f"{connected.redis_cpu * 1e6 / max(opened, 1):.0f} µs per connection; gateway RSS "
        f"+{(rss - rss_idle) / 1024:,.0f} MiB ({(rss - rss_idle) / max(opened, 1):,.0f} KiB per "
        f"connection); load generators +{connected.loadgen_rss_kib / 1024:,.0f} MiB",
        flush=True,
    )
    return connected, answers


async def after_connect(
    args: argparse.Namespace, gateways: Gateways, machine: Machine, connected: Connected
) -> None:
    """The gateways once every client is connected: their collector, the experiments of
    ``--gateway-gc``, their open files, their CPU with every socket idle."""
    opened, wall = connected.opened, connected.wall
    if connected.gc:
        objects = await gateways.command("objects")
        connected.tracked = sum(a["objects"] for a in objects)
        print(
            f"  the gateways' cyclic GC meanwhile: {gc_text(connected.gc, wall)}; it now tracks "
            f"{connected.tracked:,} objects ({connected.tracked / max(opened, 1):,.0f} per socket)"
        )
    if args.gateway_gc == "freeze" and gateways.controllable:
        frozen = await gateways.command("freeze")
        print(
            "  EXPERIMENT (--gateway-gc freeze): gc.collect() + gc.freeze() in the gateway(s): "
            + ", ".join(f"{a['frozen']:,} objects frozen in {a['seconds']:.2f} s" for a in frozen)
        )
        await gateways.command("gc")
    elif args.gateway_gc == "off" and gateways.controllable:
        await gateways.command("disable")
        print("  EXPERIMENT (--gateway-gc off): gc.disable() in the gateway(s)")
    if len(gateways.pids) > 1:
        print(
            "  open file descriptors per instance (mostly its sockets): "
            + " + ".join(f"{proc.open_files(pid):,}" for pid in gateways.pids)
        )
    if args.idle > 0:
        before = machine.snapshot()
        await asyncio.sleep(args.idle)
        idle = Machine.delta(before, machine.snapshot())
        connected.idle_gateway = sum(idle["gateways"]) / args.idle
        print(
            f"  idle for {args.idle:g} s with every socket open: gateway CPU "
            f"{100 * connected.idle_gateway:.0f}%, Redis {100 * idle['redis'] / args.idle:.0f}%, "
            f"load generators {100 * idle['loadgen'] / args.idle:.0f}%, other "
            f"{100 * idle['other'] / args.idle:.0f}%",
            flush=True,
        )
