"""The gateway's two WebSocket stacks: memory per idle connection, CPU per incoming frame.

Run:  .venv/bin/python bench/websocket_stack_bench.py [--sockets 1000,5000] [--rounds 3]
      .venv/bin/python bench/websocket_stack_bench.py --sockets 1000 --rounds 1 --trace

Socket.IO connections are read by the gateway's own WebSocket driver (``seams/websocket.py``,
``wire/frames.py``: the connection taken from aiohttp after the upgrade, no task while idle);
Flywheel (``/broker``) and Gobbler (``/gobbler``) connections by aiohttp's
``web.WebSocketResponse`` (``outbound/plain_websocket.py``: a handler task per connection awaiting
``receive()``). What the gateway writes is the same bytes for both (``wire.frames``).

For each N of ``--sockets``, round by round, each protocol of ``--protocols`` on a fresh
``lib/gateway.py`` (in-process backplane, pinned to ``--server-cpu``; this process, the lean
clients, on ``--client-cpu``): N idle authenticated connections (``socketio``: Socket.IO protocol
2 over the websocket transport only; ``flywheel``: bound with a token and ``subscribe
["bench"]``; ``gobbler``: the token in the query, ready at ``#ok-connected``), then

- memory: the gateway's RSS (VmRSS, after a full collection) before and after opening them, per
  connection; ``--trace`` adds tracemalloc's growth per connection (Python objects only; it slows
  the gateway, so its own pass, after the others);
- CPU per incoming frame, for each of ``--kinds``: every connection sends ``--frames`` frames,
  ``--rate`` a second (under the gateway's incoming rule, 100 at once then 20 a second), and
  the gateway's CPU time (``CLOCK_PROCESS_CPUTIME_ID``), less its idle rate measured just
  before, is divided by the frames sent. ``pong``: a frame read for the liveness bookkeeping
  alone (Socket.IO: the Engine.IO PONG text frame ``3``; plain WebSocket: an unsolicited pong
  control frame), no reply; ``text``: the cheapest text frame of each protocol (Socket.IO:
  ``42["noop"]``, an event the gateway ignores, no reply; Gobbler: ``- /nothing``, which
  cancels nothing and writes ``#canceled``; Flywheel: ``P nothing x``, a publish this gateway
  refuses, which writes an error frame).

Each figure is printed per round; the summary gives min / median over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lib import gateway, gateways, listeners, machine, proc, stats
from lib.gateways import Gateways
from lib.lean.books import Books, Message
from lib.lean.connect import factory
from lib.lean.flywheel import FlywheelClient
from lib.lean.websocket import LeanClient, client_frame
from lib.variants import package_layout

PROTOCOLS = ("socketio", "flywheel", "gobbler")
KINDS = ("pong", "text")
TEXT_FRAMES = {"socketio": b'42["noop"]', "flywheel": b"P nothing x", "gobbler": b"- /nothing"}


class GobblerClient(LeanClient):
    """One lean Gobbler connection (``/gobbler?v=...&token=...``): ready at ``#ok-connected``;
    status messages (``#canceled``...) are read and dropped; pings answered as any websocket."""

    def __init__(self, books: Books, host: str, token: str) -> None:
        super().__init__(books, host, token, proto=2)

    def _path(self) -> str:
        return f"/gobbler?v={gateway.OUTBOUND_VERSION}&token={self.token}"

    def _packet(self, opcode: int, payload: bytes) -> Message | None:
        if opcode != 0x1:
            return super()._packet(opcode, payload)
        if payload.startswith(b"#ok-connected"):
            if not self.ready.done():
                self.ready.set_result(None)
        elif payload.startswith(b"!"):
            self.reason = f"Gobbler {payload[:200]!r}"
        return None


def make_client(protocol: str, books: Books, host: str, token: str) -> LeanClient:
    if protocol == "flywheel":
        return FlywheelClient(books, host, token)
    if protocol == "gobbler":
        return GobblerClient(books, host, token)
    return LeanClient(books, host, token, proto=2)


def frame_of(protocol: str, kind: str) -> bytes:
    """The client frame every connection sends (masked once: the gateway unmasks each)."""
    if kind == "text":
        return client_frame(TEXT_FRAMES[protocol])
    return client_frame(b"3") if protocol == "socketio" else client_frame(b"", 0xA)


async def open_all(
    protocol: str, host: str, port: int, n: int, concurrency: int, retries: int = 30
) -> tuple[list[LeanClient], list[str]]:
    """Listeners 0..n-1 connected and authenticated, ``concurrency`` handshakes at a time
    (a 503, over the gateway's connection rate, retried after 1-2 s as Retry-After says)."""
    loop = asyncio.get_running_loop()
    semaphore = asyncio.Semaphore(concurrency)
    books = Books()
    clients: list[LeanClient] = []
    failures: list[str] = []

    async def open_one(i: int) -> None:
        token = listeners.token(i)
        for attempt in range(retries + 1):
            client = make_client(protocol, books, f"{host}:{port}", token)
            async with semaphore:
                try:
                    await loop.create_connection(factory(client), host, port)
                    await asyncio.wait_for(client.ready, 60)
                except (OSError, TimeoutError) as error:
                    client.close()
                    if "503" not in client.reason or attempt == retries:
                        failures.append(client.reason or f"{type(error).__name__}: {error}")
                        return
                else:
                    clients.append(client)
                    return
            await asyncio.sleep(1.0 + random.random())

    await asyncio.gather(*(open_one(i) for i in range(n)))
    return clients, failures


@dataclass
class Figures:
    """One protocol at one N in one round."""

    opened: int = 0
    failures: int = 0
    rss_before_kib: int = 0
    rss_after_kib: int = 0
    traced_bytes: float = float("nan")  # tracemalloc's growth per connection (--trace)
    cpu_us: dict[str, float] = field(default_factory=dict)  # kind -> µs per incoming frame
    dropped: int = 0  # connections the gateway closed meanwhile

    @property
    def kib_per_connection(self) -> float:
        return (self.rss_after_kib - self.rss_before_kib) / max(self.opened, 1)


async def cpu_ns(gw: Gateways) -> int:
    return int((await gw.command("cpu"))[0]["cpu_ns"])


async def wait_idle(gw: Gateways, limit: float, step: float = 0.25) -> None:
    """Until the gateway used under 5% of a CPU for two steps in a row (at most ``limit`` s)."""
    deadline, quiet, last = time.monotonic() + limit, 0, await cpu_ns(gw)
    while quiet < 2 and time.monotonic() < deadline:
        await asyncio.sleep(step)
        now = await cpu_ns(gw)
        quiet = quiet + 1 if now - last < 0.05 * step * 1e9 else 0
        last = now


async def frame_cost(
    gw: Gateways, clients: list[LeanClient], frame: bytes, count: int, rate: float
) -> float:
    """µs of gateway CPU per frame: every client sends ``count`` copies of ``frame``, ``rate`` a
    second each (spread: one client in ``1/ticks`` writes at each of ``ticks`` steps), less the
    gateway's idle CPU over as long."""
    await wait_idle(gw, 10.0)
    idle_started, idle_cpu = time.perf_counter(), await cpu_ns(gw)
    await asyncio.sleep(2.0)
    idle_rate = (await cpu_ns(gw) - idle_cpu) / (time.perf_counter() - idle_started)
    ticks = 10  # per frame period
    slices = [clients[k::ticks] for k in range(ticks)]
    step = 1.0 / rate / ticks
    started, before = time.perf_counter(), await cpu_ns(gw)
    due = time.monotonic()
    for _ in range(count):
        for part in slices:
            for client in part:
                transport = client.transport
                if transport is not None and not transport.is_closing():
                    transport.write(frame)
            due += step
            await asyncio.sleep(max(0.0, due - time.monotonic()))
    await wait_idle(gw, 30.0)
    used = await cpu_ns(gw) - before - idle_rate * (time.perf_counter() - started)
    return used / 1e3 / (count * len(clients))


async def measure(
    args: argparse.Namespace, gw: Gateways, protocol: str, n: int, trace: bool
) -> Figures:
    """Open N connections of ``protocol``, read RSS (and tracemalloc), then the frames' cost."""
    port = int(gw.socket_urls[0].rsplit(":", 1)[1])
    figures = Figures()
    await asyncio.sleep(args.idle)
    if trace:
        await gw.command("trace")
    await gw.command("collect")
    figures.rss_before_kib = proc.rss_kib(gw.pids[0])["VmRSS"]
    clients, failures = await open_all(protocol, args.host, port, n, args.connect_concurrency)
    figures.opened, figures.failures = len(clients), len(failures)
    if failures:
        print(f"  WARNING: {len(failures)} could not connect; first: {failures[0]}", flush=True)
    try:
        await asyncio.sleep(args.idle)
        await gw.command("collect")
        figures.rss_after_kib = proc.rss_kib(gw.pids[0])["VmRSS"]
        if trace:
            answer = (await gw.command(f"trace {len(clients)}"))[0]
            figures.traced_bytes = answer["bytes_per_socket"]
            top = ", ".join(
                f"{name.rsplit('pythonpath/', 1)[-1].rsplit('python3.11/', 1)[-1]} {size:,} B"
                for name, size in answer["by_file"][:8]
            )
            print(f"  tracemalloc by file, per connection: {top}", flush=True)
            return figures
        for kind in args.kinds:
            frame = frame_of(protocol, kind)
            figures.cpu_us[kind] = await frame_cost(gw, clients, frame, args.frames, args.rate)
        counts = (await gw.command("sockets"))[0]["sockets"]
        figures.dropped = int(sum(counts["disconnects"].values())) + sum(c.lost for c in clients)
        return figures
    finally:
        for client in clients:
            client.books.closing = True
            client.close()


def start_gateway(args: argparse.Namespace) -> Gateways:
    """A ``lib/gateway.py`` of this tree, or of ``--gateway``'s (``PYTHONPATH``), pinned."""
    env, source = dict(os.environ), getattr(args, "pythonpath", None)
    if source:
        env["PYTHONPATH"] = source
    line = gateways.command("--namespace", "wsstack")
    process, started = gateways.spawn(line, env, source)
    gateways.check_source(process, started, source, "--gateway's")
    machine.pin_gateway(started["pid"], args.server_cpu)
    url = f"http://127.0.0.1:{started['port']}"
    return gateways.controllable(f"pid {started['pid']}", [process], [started["pid"]], [url])


def run_one(args: argparse.Namespace, protocol: str, n: int, trace: bool = False) -> Figures:
    if args.quiet > 0:
        machine.wait_for_quiet(args.quiet)
    gw = start_gateway(args)
    try:
        figures = asyncio.run(measure(args, gw, protocol, n, trace))
    finally:
        gw.stop()
    cpu = ", ".join(f"{kind} {us:.1f} µs" for kind, us in figures.cpu_us.items())
    traced = f", tracemalloc {figures.traced_bytes:,.0f} B" if trace else ""
    print(
        f"  {protocol:<8} N={n:,}: {figures.opened:,} open; RSS {figures.rss_before_kib / 1024:.1f}"
        f" -> {figures.rss_after_kib / 1024:.1f} MiB = {figures.kib_per_connection:.2f} KiB per "
        f"connection{traced}; CPU per incoming frame: {cpu or '-'}; dropped {figures.dropped}",
        flush=True,
    )
    return figures


def min_median(values: Sequence[float], form: str) -> str:
    if not values:
        return "-"
    return f"{form.format(min(values))} / {form.format(statistics.median(values))}"


def summarize(args: argparse.Namespace, results: dict[tuple[int, str], list[Figures]]) -> None:
    headers = ["N, protocol", "KiB per connection"]
    headers += [f"µs per {kind} frame" for kind in args.kinds]
    rows: list[list[object]] = []
    for (n, protocol), runs in results.items():
        row: list[object] = [f"{n:,} {protocol}"]
        row.append(min_median([r.kib_per_connection for r in runs], "{:.2f}"))
        for kind in args.kinds:
            row.append(min_median([r.cpu_us[kind] for r in runs if kind in r.cpu_us], "{:.2f}"))
        rows.append(row)
    print(f"\nSummary, min / median over {args.rounds} rounds:")
    print(stats.table(headers, rows))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sockets", default="1000,5000", help="comma-separated values of N")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, protocols interleaved")
    parser.add_argument(
        "--protocols", default=",".join(PROTOCOLS), help="among " + ", ".join(PROTOCOLS)
    )
    parser.add_argument("--kinds", default=",".join(KINDS), help="incoming frames: pong, text")
    parser.add_argument("--frames", type=int, default=30, help="frames per connection and kind")
    parser.add_argument("--rate", type=float, default=5.0, help="frames a second per connection")
    parser.add_argument("--idle", type=float, default=2.0, help="s idle before reading RSS")
    parser.add_argument("--quiet", type=float, default=10.0, help="s to wait for a quiet machine")
    parser.add_argument("--trace", action="store_true", help="also tracemalloc, a pass each")
    parser.add_argument("--connect-concurrency", type=int, default=100)
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--gateway",
        help="another checkout's bow_gateway (e.g. /tmp/bow-HEAD from `git archive`) rather "
        "than this working tree's, which others may be editing",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    protocols = [p for p in args.protocols.split(",") if p]
    args.kinds = [k for k in args.kinds.split(",") if k]
    if set(protocols) - set(PROTOCOLS) or set(args.kinds) - set(KINDS):
        parser.error("unknown protocols or kinds")
    if args.rate * args.frames > 100 + 20 * args.frames / args.rate or args.rate > 20:
        parser.error("over the gateway's incoming rule (100 at once, then 20 a second)")
    sizes = [int(s.replace("_", "")) for s in args.sockets.split(",") if s]
    soft, hard = machine.raise_open_files_limit()
    print(machine.environment(["aiohttp", "python-socketio", "python-engineio"]))
    print(f"bow_gateway: {machine.git_state()}; open files limit {soft} (hard {hard})")
    os.sched_setaffinity(0, {args.client_cpu})
    results: dict[tuple[int, str], list[Figures]] = {}
    with tempfile.TemporaryDirectory(prefix="wsstack-") as workdir:
        if args.gateway:
            args.pythonpath = str(package_layout(Path(args.gateway), Path(workdir)))
        for n in sizes:
            for round_ in range(args.rounds):
                print(f"== N = {n:,}, round {round_ + 1}", flush=True)
                for protocol in protocols:
                    results.setdefault((n, protocol), []).append(run_one(args, protocol, n))
        summarize(args, results)
        if args.trace:
            print("\ntracemalloc (Python allocations only), one pass each:")
            for protocol in protocols:
                run_one(args, protocol, sizes[0], trace=True)
    return 1 if any(r.failures or r.dropped for rs in results.values() for r in rs) else 0


if __name__ == "__main__":
    sys.exit(main())
