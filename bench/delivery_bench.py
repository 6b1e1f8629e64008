"""End-to-end delivery benchmark: POST messages to a real gateway, receive them on real sockets.

Run:  .venv/bin/python bench/delivery_bench.py [--listeners 1000] [--duration 5] [--window 8]

A plain script, not a test. The gateway (``bench/_gateway.py``: JWT outbound, claims middleware,
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
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as common
import _gateway as gateway
import aiohttp
import socketio
from bow_gateway.outbounds.jwt import mint

HERE = Path(__file__).resolve().parent
AUTH = {"Authorization": aiohttp.encode_basic_auth(gateway.USER, gateway.PASSWORD)}
EVENT = "bench"


# -- receipt bookkeeping ------------------------------------------------------------------------


@dataclass
class Tracker:
    """What one phase expects and what the clients received."""

    latencies: list[int] = field(default_factory=list)  # ns, POST start to handler, per delivery
    post_times: list[int] = field(default_factory=list)  # ns, POST start to its 204
    pending: dict[int, list[Any]] = field(default_factory=dict)  # seq -> [remaining, on_done]
    deliveries: int = 0
    late: int = 0  # receipts for a message no longer expected (duplicates or after a timeout)
    errors: int = 0
    last_receipt: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def expect(self, seq: int, count: int, on_done: Callable[[], None]) -> None:
        self.idle.clear()
        self.pending[seq] = [count, on_done]

    def receive(self, data: Any) -> None:
        now = time.monotonic_ns()
        entry = self.pending.get(data["seq"])
        if entry is None:
            self.late += 1
            return
        self.latencies.append(now - data["t"])
        self.deliveries += 1
        self.last_receipt = now
        entry[0] -= 1
        if entry[0] == 0:
            self._done(data["seq"])

    def fail(self, seq: int) -> None:
        self.errors += 1
        self._done(seq)

    def _done(self, seq: int) -> None:
        entry = self.pending.pop(seq, None)
        if entry is not None:
            entry[1]()
        if not self.pending:
            self.idle.set()


class Current:
    tracker = Tracker()


# -- the gateway process ------------------------------------------------------------------------


def start_gateway(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], int, int]:
    command = [sys.executable, str(HERE / "_gateway.py")]
    if args.profile:
        command += ["--profile", args.profile]
    if args.pin and shutil.which("taskset"):
        command = ["taskset", "-c", str(args.server_cpu), *command]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.wait(5)
        raise SystemExit(f"the gateway did not start (exit status {process.returncode})")
    started = json.loads(line)
    return process, started["port"], started["pid"]


def stop_gateway(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- clients ----------------------------------------------------------------------------------


def listener_id(i: int) -> str:
    return f"bench-{i}"


def criteria(i: int) -> dict[str, Any]:
    return {"all": True, "g10": i % 10 == 0, "role": ("admin", "author", "subscriber")[i % 3]}


async def open_clients(url: str, count: int, concurrency: int) -> list[socketio.AsyncClient]:
    semaphore = asyncio.Semaphore(concurrency)
    clients: list[socketio.AsyncClient | None] = [None] * count

    async def open_one(i: int) -> None:
        client = socketio.AsyncClient(reconnection=False)
        client.on(EVENT, lambda data: Current.tracker.receive(data))
        token = mint(listener_id(i), gateway.SECRET, criteria=criteria(i))
        async with semaphore:
            await client.connect(
                f"{url}?v={gateway.OUTBOUND_VERSION}", transports=["websocket"], wait_timeout=30
            )
            await client.call("authenticate", token, timeout=30)
        clients[i] = client

    await asyncio.gather(*(open_one(i) for i in range(count)))
    return [client for client in clients if client is not None]


async def close_clients(clients: Sequence[socketio.AsyncClient], concurrency: int) -> None:
    semaphore = asyncio.Semaphore(concurrency)

    async def close_one(client: socketio.AsyncClient) -> None:
        async with semaphore:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), 10)

    await asyncio.gather(*(close_one(c) for c in clients))


# -- phases -----------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    audience: Callable[[int], tuple[list[dict[str, Any]], int]]  # seq -> (audience, expected)
    window: int
    duration: float | None = None  # seconds of sending, or
    count: int | None = None  # messages


@dataclass
class Result:
    phase: Phase
    messages: int
    tracker: Tracker
    wall: float  # s, first POST to last receipt
    server_cpu: float  # s
    server_sys: float  # s, of which in the kernel (stime)
    loadgen_cpu: float  # s
    other_cpu: float  # s, every other process of the machine (other benchmarks, test runs...)
    server_rss_kib: int
    profile: str | None = None  # where the gateway's cProfile stats of this phase are


async def run_phase(
    phase: Phase, session: aiohttp.ClientSession, url: str, server_pid: int, drain: float
) -> Result:
    tracker = Current.tracker = Tracker()
    window = asyncio.Semaphore(phase.window)
    tasks: set[asyncio.Task[None]] = set()

    async def post(seq: int, audience: list[dict[str, Any]]) -> None:
        started = time.monotonic_ns()
        body = {"name": EVENT, "audience": audience, "seq": seq, "t": started}
        try:
            async with session.post(url, json=body, headers=AUTH) as response:
                await response.read()
                ok = response.status == 204
        except aiohttp.ClientError:
            ok = False
        tracker.post_times.append(time.monotonic_ns() - started)
        if not ok:
            tracker.fail(seq)

    user_before, sys_before = common.cpu_times(server_pid)
    own_before = time.process_time()
    busy_before = common.machine_busy_seconds()
    started = time.monotonic_ns()
    deadline = started + int((phase.duration or 0) * 1e9)
    seq = 0
    while (phase.count is not None and seq < phase.count) or (
        phase.duration is not None and time.monotonic_ns() < deadline
    ):
        await window.acquire()
        seq += 1
        audience, expected = phase.audience(seq)
        tracker.expect(seq, expected, window.release)
        task = asyncio.create_task(post(seq, audience))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(tracker.idle.wait(), drain)
    if tasks:
        await asyncio.gather(*tasks)
    ended = tracker.last_receipt or time.monotonic_ns()
    user_after, sys_after = common.cpu_times(server_pid)
    server_cpu = user_after + sys_after - user_before - sys_before
    loadgen_cpu = time.process_time() - own_before
    busy = common.machine_busy_seconds() - busy_before
    return Result(
        phase=phase,
        messages=seq,
        tracker=tracker,
        wall=(ended - started) / 1e9,
        server_cpu=server_cpu,
        server_sys=sys_after - sys_before,
        loadgen_cpu=loadgen_cpu,
        other_cpu=max(0.0, busy - server_cpu - loadgen_cpu),
        server_rss_kib=common.rss_kib(server_pid)["VmRSS"],
    )


def result_row(result: Result) -> list[str]:
    tracker = result.tracker
    median, p99, _, _ = common.summary(tracker.latencies)
    deliveries = tracker.deliveries
    missing = sum(entry[0] for entry in tracker.pending.values())
    return [
        result.phase.name,
        str(result.phase.window),
        f"{result.messages:,}",
        f"{deliveries:,}" + (f" ({missing:,} missing)" if missing else ""),
        f"{result.wall:.2f}",
        f"{deliveries / result.wall:,.0f}" if result.wall > 0 else "-",
        common.human_ns(median),
        common.human_ns(p99),
        common.human_ns(common.summary(tracker.post_times)[0]),
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


async def bench(args: argparse.Namespace, port: int, server_pid: int) -> list[Result]:
    base = f"http://127.0.0.1:{port}"
    n = args.listeners
    in_group = sum(1 for i in range(n) if criteria(i)["g10"])
    rng = random.Random(args.seed)

    rss_idle = common.rss_kib(server_pid)["VmRSS"]
    cpu_before = common.cpu_seconds(server_pid)
    started = time.perf_counter()
    clients = await open_clients(base, n, args.connect_concurrency)
    connect_wall = time.perf_counter() - started
    # Keep the load generator's own full collections (1,000 clients are many objects) out of
    # the latencies: what exists now is never scanned again. The gateway is left as it is.
    gc.collect()
    gc.freeze()
    connect_cpu = common.cpu_seconds(server_pid) - cpu_before
    rss_connected = common.rss_kib(server_pid)["VmRSS"]
    print(
        f"connected and authenticated {n:,} websocket clients in {connect_wall:.1f} s "
        f"({n / connect_wall:,.0f}/s); gateway CPU {connect_cpu * 1e3 / n:.2f} ms per connection; "
        f"gateway RSS {rss_idle / 1024:,.0f} MiB idle -> {rss_connected / 1024:,.0f} MiB "
        f"({(rss_connected - rss_idle) / n:,.0f} KiB per connection)"
    )
    print()

    phases = [
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
    print()
    print(
        f"{n:,} listeners ({in_group:,} in the 10% group). Latency: POST start to the client's "
        "handler, per delivery.\nCPU columns: CPU seconds / wall seconds (100% = one CPU busy); "
        "'other' is every other process on the machine.\nCPU times come from /proc in 10 ms "
        "ticks: short phases are coarse."
        + (
            " The gateway ran under cProfile (its CPU figures are inflated)."
            if args.profile
            else ""
        )
    )
    print(common.table(HEADERS, [result_row(r) for r in results]))
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
    started = time.perf_counter()
    await close_clients(clients, args.connect_concurrency)
    print(f"disconnected the clients in {time.perf_counter() - started:.1f} s")
    return results


def main(argv: Sequence[str] | None = None) -> int:
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
    args = parser.parse_args(argv)
    if args.profile:
        args.profile = str(Path(args.profile).resolve())

    can_pin = hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2
    args.pin = args.pin and can_pin and shutil.which("taskset") is not None
    print(common.environment(["aiohttp", "python-socketio", "python-engineio", "PyJWT"]))
    process, port, pid = start_gateway(args)
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
        stop_gateway(process)
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
            stats = pstats.Stats(result.profile)
            stats.sort_stats("tottime").print_stats(args.profile_lines)
            stats.sort_stats("cumulative").print_stats(args.profile_lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
