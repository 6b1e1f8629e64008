"""Protocol 2 through Redis: 1,000 clients recovering at once after their instance restarted.

Run:  .venv/bin/python bench/restart_bench.py [--sockets 1000] [--before 10] [--missed 50]
      .venv/bin/python bench/restart_bench.py --source /path/to/checkout   # another gateway

A plain script, not a test (issue 13, "Done when" (c): every client recovers, and the gateway's
longest event-loop stall stays under 250 ms). It needs the Redis backplane's positions (the
history must outlive the instance): it starts a private ``redis-server`` (``_redis.py``: a free
port, no persistence, never the shared one on 6379) pinned to CPU 1, and ``_gateway.py --redis``
(JWT outbound v1.3, claims middleware, pass-through inbound; recovery at its defaults) pinned to
CPU 0; this process, the load generator, runs on CPU 1. Then:

1. ``--sockets`` lean protocol-2 websocket clients (``recovery_bench.RecoveringClient``:
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
   and longest GC during the reconnection (``_gateway.py``'s 10 ms probe), its CPU time, and
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
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _common as common
import _gateway as gateway
import fanout_bench as fanout
import redis_bench
from _redis import RedisServer
from bow_gateway.outbounds.jwt import mint
from recovery_bench import RecoveringClient

Spec = tuple[str, int]  # ("all", 0), ("g10", 0) or ("id", listener)


def plan(count: int, sockets: int, rng: random.Random) -> list[Spec]:
    """``count`` audiences: one in 5 to everyone, one in 5 to the 10% group, the rest to one."""
    specs: list[Spec] = []
    for k in range(count):
        if k % 5 == 0:
            specs.append(("all", 0))
        elif k % 5 == 1:
            specs.append(("g10", 0))
        else:
            specs.append(("id", rng.randrange(sockets)))
    return specs


def audience(spec: Spec) -> bytes:
    kind, listener = spec
    if kind == "all":
        return b'[{"all":true}]'
    if kind == "g10":
        return b'[{"g10":true}]'
    return b'[{"__id":"%s"}]' % redis_bench.listener_id(listener).encode()


def targets(i: int, spec: Spec) -> bool:
    kind, listener = spec
    if kind == "all":
        return True
    if kind == "g10":
        return bool(redis_bench.criteria(i)["g10"])
    return listener == i


async def post_all(posters: fanout.Posters, specs: list[Spec], tag: str) -> int:
    """POST the messages one at a time, in order; how many were not answered 204."""
    failed = 0
    for k, spec in enumerate(specs):
        body = b'{"name":"%s","audience":%s,"payload":{"tag":"%s","k":%d}}' % (
            fanout.EVENT.encode(),
            audience(spec),
            tag.encode(),
            k,
        )
        if await posters.post(body) != 204:
            failed += 1
    return failed


class Fleet:
    """The clients, one per listener, and their tokens."""

    def __init__(self, host: str, port: int, sockets: int) -> None:
        self.host, self.port = host, port
        self.tokens = [
            mint(redis_bench.listener_id(i), gateway.SECRET, criteria=redis_bench.criteria(i))
            for i in range(sockets)
        ]
        self.clients: list[RecoveringClient | None] = [None] * sockets

    async def open(
        self, i: int, options: dict[str, Any], expected: int, timeout: float
    ) -> RecoveringClient:
        client = RecoveringClient(f"{self.host}:{self.port}", self.tokens[i], options, expected)
        self.clients[i] = client
        loop = asyncio.get_running_loop()
        await loop.create_connection(lambda: client, self.host, self.port)
        await asyncio.wait_for(asyncio.shield(client.done), timeout)
        return client

    def close(self) -> None:
        for client in self.clients:
            if client is not None:
                client.books.closing = True
                client.close()


async def wait_for(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def bench(args: argparse.Namespace, redis: RedisServer, workdir: str) -> int:
    rng = random.Random(args.seed)
    variant = fanout.source_variant(args.source, 2, workdir)
    try:
        gateways = fanout.start_variant(variant, redis, "restart")
    except SystemExit as error:
        print(
            f"CANNOT RUN: {error} with the Redis backplane (its traceback above; before the "
            "Redis backplane has positions, RedisBackplane cannot be instantiated)"
        )
        return 2
    fanout.pin_gateway(gateways.pids[0], args.server_cpu)
    port = int(gateways.socket_urls[0].rsplit(":", 1)[1])
    print(f"gateway: {gateways.description}, pinned to CPU {args.server_cpu}", flush=True)
    fleet = Fleet(args.host, port, args.sockets)
    try:
        # 1. connect
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
            return 2

        # 2. some messages, one at a time; each client keeps its last position
        posters = fanout.Posters(args.host, port)
        posters.grow(2)
        before = plan(args.before, args.sockets, rng)
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
            return 2
        print(
            f"{args.before} messages before the restart ({sum(wanted):,} deliveries); every "
            f"client recorded its last position (e.g. {positions[0]!r})",
            flush=True,
        )

        # 3. kill the instance, start a new one on the same port and Redis
        for client in fleet.clients:
            if client is not None:
                client.books.closing = True
        killed = time.perf_counter()
        gateways.processes[0].kill()
        gateways.processes[0].wait()
        gateways = fanout.start_variant(variant, redis, "restart", ["--port", str(port)])
        fanout.pin_gateway(gateways.pids[0], args.server_cpu)
        print(
            f"killed the gateway (SIGKILL) and started another on the same port and Redis: "
            f"serving after {time.perf_counter() - killed:.2f} s ({gateways.description})",
            flush=True,
        )
        lost = await wait_for(lambda: all(c is None or c.lost for c in fleet.clients), 10)
        if not lost:
            print("WARNING: some clients did not notice the restart within 10 s")

        # 4. messages the clients miss
        posters = fanout.Posters(args.host, port)
        posters.grow(2)
        missed = plan(args.missed, args.sockets, rng)
        failed = await post_all(posters, missed, "missed")
        expected = [sum(targets(i, s) for s in missed) for i in range(args.sockets)]
        print(
            f"{args.missed} messages while the clients were away ({failed} failed): "
            f"{sum(expected):,} replays expected, {min(expected)}-{max(expected)} per client",
            flush=True,
        )
        await asyncio.sleep(args.settle)

        # 5. everyone at once
        async def command(text: str) -> dict[str, Any]:
            return (await gateways.command(text))[0]

        spy = None
        if args.py_spy:  # sample the new gateway during the reconnection
            spy = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "-p",
                    str(gateways.pids[0]),
                    "-r",
                    "1000",
                    "-f",
                    "raw",
                    "-o",
                    args.py_spy,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            await asyncio.sleep(1.0)  # py-spy attaches
        await command("stall")
        await command("gc")
        cpu_before = (await command("cpu"))["cpu_ns"]
        attempts = Counter[int]()
        failures = Counter[str]()
        done_at: list[float | None] = [None] * args.sockets
        outcome: list[RecoveringClient | None] = [None] * args.sockets
        succeeded_at: list[int | None] = [None] * args.sockets  # which attempt connected
        started = time.perf_counter()

        async def again(i: int) -> None:
            for attempt in range(args.retries + 1):
                attempts[attempt] += 1
                try:
                    client = await fleet.open(i, {"since": positions[i]}, expected[i], args.timeout)
                except (OSError, TimeoutError) as error:
                    failed_client = fleet.clients[i]
                    reason = failed_client.reason if failed_client is not None else ""
                    failures[(reason or f"{type(error).__name__}: {error}")[:120]] += 1
                    if failed_client is not None:
                        failed_client.close()
                    await asyncio.sleep(args.retry_after * (1 + rng.random()))
                    continue
                done_at[i] = client.done.result() - started
                outcome[i] = client
                succeeded_at[i] = attempt
                return

        await asyncio.gather(*(again(i) for i in range(args.sockets)))
        took = time.perf_counter() - started
        cpu_after = (await command("cpu"))["cpu_ns"]
        stall = (await command("stall"))["stall"]
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
            print(f"py-spy samples (raw, collapsed stacks) of the reconnection: {args.py_spy}")
        collections = (await command("gc"))["gc"]
        counters = (await command("recoveries"))["recoveries"]
        sockets = (await command("sockets"))["sockets"]

        # 6. what came of it
        reasons = Counter[str]()
        recovered = first_try = 0
        for i, client in enumerate(outcome):
            if client is None:
                reasons["could not connect"] += 1
                continue
            result = client.result if isinstance(client.result, dict) else {}
            replays = [p for p, replayed in client.events if replayed]
            ok = (
                result.get("recovered") is True
                and client.replayed == expected[i]
                and all(replayed for _, replayed in client.events[: expected[i]])
                and len(set(replays)) == len(replays)
            )
            if result.get("recovered") is True and not ok:
                reasons["recovered: true, wrong replay"] += 1
            else:
                reasons[f"recovered: {result.get('recovered')}, reason {result.get('reason')}"] += 1
            if ok:
                recovered += 1
                first_try += succeeded_at[i] == 0
        times = sorted(t for t in done_at if t is not None)
        print()
        print(
            f"reconnected {args.sockets:,} clients at once with since: {recovered:,} recovered "
            f"everything they missed, {first_try:,} at the first attempt "
            f"({sum(1 for t in done_at if t is not None):,} connected); "
            f"connection attempts: {dict(sorted(attempts.items()))} (attempt 0 = the first)"
        )
        print(f"  acks: {dict(reasons)}")
        if failures:
            print(f"  failed attempts: {dict(failures.most_common(5))}")
        if times:
            print(
                f"  time to recover, from the first connect: all {times[-1]:.2f} s, median "
                f"{statistics.median(times):.2f} s, first {times[0] * 1e3:.0f} ms (whole "
                f"reconnection {took:.2f} s)"
            )
        print(
            f"  the gateway meanwhile: longest event-loop stall "
            f"{stall['longest'] * 1e3:.0f} ms (10 ms probe, {stall['ticks']} ticks in "
            f"{stall['seconds']:.2f} s), longest GC {max(collections['longest']) * 1e3:.0f} ms "
            f"({collections['collections'][2]} full), CPU {(cpu_after - cpu_before) / 1e9:.2f} s "
            f"({(cpu_after - cpu_before) / 1e6 / args.sockets:.2f} ms per client); it counts "
            f"{sockets['authenticated']:,.0f} authenticated sockets"
        )
        print(f"  its recovery metrics: {counters}")
        all_recovered = recovered == args.sockets
        under = stall["longest"] * 1e3 < args.target_ms
        print(
            f"target: all {args.sockets:,} recover: {'ok' if all_recovered else 'NO'}; longest "
            f"stall {stall['longest'] * 1e3:.0f} ms < {args.target_ms:g} ms: "
            f"{'ok' if under else 'NO'}: " + ("MET" if all_recovered and under else "MISSED")
        )
        return 0 if all_recovered and under else 1
    finally:
        fleet.close()
        gateways.stop()


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

    redis_bench.raise_open_files_limit()
    print(common.environment(["aiohttp", "python-socketio", "python-engineio", "PyJWT", "redis"]))
    print(f"bow_gateway: {args.source or redis_bench.git_state()}")
    os.sched_setaffinity(0, {args.client_cpu})
    if args.quiet > 0:
        common.wait_for_quiet(args.quiet)
    with RedisServer(cpu=args.client_cpu) as redis:
        print(
            f"redis-server {redis.version()} (private: port {redis.port}, pid {redis.pid}, no "
            f"persistence, CPU {args.client_cpu}); this process on CPU {args.client_cpu}",
            flush=True,
        )
        with tempfile.TemporaryDirectory(prefix="restart-") as workdir:
            status = asyncio.run(bench(args, redis, workdir))
    print(f"load average now: {common.load_average()}")
    return status


if __name__ == "__main__":
    sys.exit(main())
