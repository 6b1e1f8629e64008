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

- ``memory``: one ``_gateway.py``, in-process backplane (the baseline);
- ``redis``: one ``_gateway.py`` with the Redis backplane;
- ``redis-x2``: two instances sharing the Redis stream. ``--two ports`` (default): two
  ``_gateway.py`` processes on two ports; listener *j* of each load-generator process connects
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
import contextlib
import gc
import json
import logging
import math
import multiprocessing
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as common
import _gateway as gateway
import aiohttp
import socketio
from _redis import RedisServer, free_port
from bow_gateway.outbounds.jwt import mint

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EVENT = "bench"
CONFIGS = ("memory", "redis", "redis-x2")


def raise_open_files_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit (children inherit it); returns the limits now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def listener_id(i: int) -> str:
    return f"bench-{i}"


def criteria(i: int) -> dict[str, Any]:
    return {"all": True, "g10": i % 10 == 0, "role": ("admin", "author", "subscriber")[i % 3]}


# -- the gateways -------------------------------------------------------------------------------


@dataclass
class Gateways:
    """The instance(s) under test, as the load generator sees them."""

    description: str
    processes: list[subprocess.Popen[bytes]]
    pids: list[int]  # the processes that serve (CPU and RSS are read from these)
    socket_urls: list[str]  # where clients connect (spread over them)
    post_urls: list[str]  # where messages are POSTed (alternated)
    version: str
    secret: str
    user: str
    password: str
    profile: str | None = None  # _gateway.py instances write cProfile stats to <this>.<k>
    controllable: bool = False  # _gateway.py instances take commands on stdin (gc, freeze...)

    async def command(self, text: str) -> list[dict[str, Any]]:
        """Send a command line to every _gateway.py instance; their JSON answers ([] if none)."""
        if not self.controllable:
            return []
        loop = asyncio.get_running_loop()
        answers = []
        for process in self.processes:
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(text.encode() + b"\n")
            process.stdin.flush()
            line = await loop.run_in_executor(None, process.stdout.readline)
            answers.append(json.loads(line))
        return answers

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def start_bench_gateway(
    redis_url: str | None, namespace: str, profile: str | None = None
) -> tuple[subprocess.Popen[bytes], int, int]:
    command = [sys.executable, str(HERE / "_gateway.py"), "--namespace", namespace]
    if redis_url:
        command += ["--redis", redis_url]
    if profile:
        command += ["--profile", profile]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.wait(5)
        raise SystemExit(f"the gateway did not start (exit status {process.returncode})")
    started = json.loads(line)
    return process, started["port"], started["pid"]


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as file:
            return [int(p) for p in file.read().split()]
    except OSError:
        return []


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def start_serve_workers(count: int, redis_url: str, namespace: str) -> Gateways:
    """``python -m bow_gateway serve --workers N`` on the embedded default, through Redis."""
    port = free_port()
    env = {
        **os.environ,
        "BOW_REDIS_URL": redis_url,
        "BOW_NAMESPACE": namespace,
        "BOW_JWT_SECRET": gateway.SECRET,
        "BOW_INBOUND_PASSWORD": gateway.PASSWORD,
        "BOW_OUTBOUND_TIMEOUT": "60",
        "BOW_LOG_INTERVAL": "0",
    }
    env.pop("BOW_CONFIG", None)
    command = [sys.executable, "-m", "bow_gateway", "serve", "--workers", str(count)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    serving = threading.Semaphore(0)
    tail: list[str] = []

    def drain() -> None:  # read stderr to its end, so that the workers never block on it
        assert process.stderr is not None
        for raw in process.stderr:
            line = raw.decode(errors="replace").rstrip()
            tail.append(line)
            del tail[:-50]
            if "serving on" in line:
                serving.release()
            elif " WARNING " in line or " ERROR " in line:
                print(f"  serve: {line}", flush=True)

    threading.Thread(target=drain, daemon=True).start()
    for _ in range(count):
        if not serving.acquire(timeout=30):
            process.kill()
            raise SystemExit("serve --workers did not start:\n" + "\n".join(tail))
    workers = [p for p in children(process.pid) if "spawn_main" in cmdline(p)]
    if len(workers) != count:
        process.kill()
        raise SystemExit(f"expected {count} worker processes, found {workers}")
    url = f"http://127.0.0.1:{port}"
    return Gateways(
        description=f"`serve --workers {count}` (port {port} shared, SO_REUSEPORT), "
        f"worker pids {workers}",
        processes=[process],
        pids=workers,
        socket_urls=[url],
        post_urls=[url + "/v1/messages"],
        version="v1",
        secret=gateway.SECRET,
        user="pusher",
        password=gateway.PASSWORD,
    )


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
    return Gateways(
        description=f"{count} x _gateway.py ({backplane}) on port(s) "
        + ", ".join(str(port) for _, port, _ in started)
        + ", pid(s) "
        + ", ".join(str(pid) for _, _, pid in started),
        processes=[process for process, _, _ in started],
        pids=[pid for _, _, pid in started],
        socket_urls=urls,
        post_urls=[url + gateway.PATH for url in urls],
        version=gateway.OUTBOUND_VERSION,
        secret=gateway.SECRET,
        user=gateway.USER,
        password=gateway.PASSWORD,
        profile=profile,
        controllable=True,
    )


# -- the load-generator processes ---------------------------------------------------------------


def loadgen_main(path: str, index: int, count: int) -> None:
    """A load-generator process: the clients ``i`` with ``i % count == index``."""
    raise_open_files_limit()
    # "packet queue is empty, aborting": a client heard no ping from the gateway for 30 s and
    # gave up; such clients are counted (and reported) after each phase instead.
    logging.getLogger("engineio.client").setLevel(logging.CRITICAL)
    asyncio.run(_loadgen(path, index, count))


async def open_clients(
    command: dict[str, Any],
    mine: list[int],
    receive: Callable[[Any], None],
    clients: list[socketio.AsyncClient],
    failures: list[str],
) -> None:
    """Open and authenticate the clients ``mine``, ``command["concurrency"]`` at a time."""
    urls = command["urls"]
    semaphore = asyncio.Semaphore(command["concurrency"])

    async def open_one(j: int, i: int) -> None:
        client = socketio.AsyncClient(reconnection=False)
        client.on(EVENT, receive)
        token = mint(listener_id(i), command["secret"], criteria=criteria(i))
        async with semaphore:
            try:
                await client.connect(
                    f"{urls[j % len(urls)]}?v={command['version']}",
                    transports=["websocket"],
                    wait_timeout=60,
                )
                await client.call("authenticate", token, timeout=60)
            except Exception as error:  # noqa: BLE001 - counted and reported
                failures.append(f"{type(error).__name__}: {error}")
                return
        clients.append(client)

    await asyncio.gather(*(open_one(j, i) for j, i in enumerate(mine)))


async def _loadgen(path: str, index: int, count: int) -> None:
    reader, writer = await asyncio.open_unix_connection(path, limit=1 << 24)

    def send(obj: dict[str, Any]) -> None:
        writer.write(json.dumps(obj).encode() + b"\n")

    phase = {"id": -1, "expected": 0}
    counts: dict[int, int] = {}
    book: dict[str, Any] = {}

    def reset() -> None:
        book.update(latencies=[], deliveries=0, late=0, last=0)
        counts.clear()

    reset()

    def receive(data: Any) -> None:
        now = time.monotonic_ns()
        if data.get("p") != phase["id"]:
            book["late"] += 1
            return
        book["latencies"].append(now - data["t"])
        book["deliveries"] += 1
        book["last"] = now
        seq = data["seq"]
        got = counts.get(seq, 0) + 1
        if got >= phase["expected"]:
            counts.pop(seq, None)
            writer.write(b"D %d\n" % seq)
        else:
            counts[seq] = got

    clients: list[socketio.AsyncClient] = []
    mine: list[int] = []
    send({"op": "hello", "index": index, "pid": os.getpid()})
    while True:
        line = await reader.readline()
        if not line:
            break
        command = json.loads(line)
        op = command["op"]
        if op == "connect":
            mine = list(range(index, command["n"], count))
            failures: list[str] = []
            rss_before = common.rss_kib()["VmRSS"]
            cpu_before = time.process_time()
            await open_clients(command, mine, receive, clients, failures)
            gc.collect()
            gc.freeze()  # keep this process's full collections out of the latencies
            send(
                {
                    "op": "connected",
                    "n": len(clients),
                    "g10": sum(1 for i in mine if criteria(i)["g10"]),
                    "failures": len(failures),
                    "failure": failures[0] if failures else None,
                    "cpu": time.process_time() - cpu_before,
                    "rss_kib": common.rss_kib()["VmRSS"] - rss_before,
                }
            )
        elif op == "phase":
            reset()
            phase["id"] = command["p"]
            phase["expected"] = command["expected"]
            send({"op": "ready"})
        elif op == "end":
            phase["id"] = -1
            send(
                {
                    "op": "result",
                    "latencies": book["latencies"],
                    "deliveries": book["deliveries"],
                    "late": book["late"],
                    "last": book["last"],
                    "disconnected": sum(1 for c in clients if not c.connected),
                }
            )
            reset()
        elif op == "close":
            send({"op": "closed"})
            await writer.drain()
            writer.close()
            # No graceful disconnect: the gateways are stopped next and close every socket.
            os._exit(0)
        await writer.drain()


@dataclass
class Loadgen:
    index: int
    process: Any  # multiprocessing.Process
    pid: int = 0
    writer: asyncio.StreamWriter | None = None
    replies: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    n: int = 0
    g10: int = 0

    def send(self, obj: dict[str, Any]) -> None:
        assert self.writer is not None
        self.writer.write(json.dumps(obj).encode() + b"\n")

    async def reply(self, op: str, timeout: float = 600) -> dict[str, Any]:
        answer = await asyncio.wait_for(self.replies.get(), timeout)
        if answer.get("op") != op:
            raise RuntimeError(f"load generator {self.index}: expected {op!r}, got {answer}")
        return answer


# -- phases ---------------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    kind: str  # "all", "g10" or "id"
    window: int
    duration: float | None = None
    count: int | None = None


@dataclass
class Tracker:
    """Messages outstanding: seq -> [load generators still to report, on_done]."""

    pending: dict[int, list[Any]] = field(default_factory=dict)
    post_times: list[int] = field(default_factory=list)
    errors: int = 0
    stuck: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def expect(self, seq: int, count: int, on_done: Callable[[], None]) -> None:
        self.idle.clear()
        self.pending[seq] = [count, on_done]

    def done(self, seq: int) -> None:
        entry = self.pending.get(seq)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] <= 0:
            self._finish(seq)

    def fail(self, seq: int) -> None:
        self.errors += 1
        self._finish(seq)

    def _finish(self, seq: int) -> None:
        entry = self.pending.pop(seq, None)
        if entry is not None:
            entry[1]()
        if not self.pending:
            self.idle.set()


@dataclass
class Result:
    config: str
    sockets: int
    phase: Phase
    messages: int
    deliveries: int
    expected: int
    latencies: list[int]
    post_times: list[int]
    wall: float
    gateway_cpu: list[float]  # s, per instance
    redis_cpu: float
    loadgen_cpu: float
    other_cpu: float
    late: int
    errors: int
    gc: list[dict[str, Any]] = field(default_factory=list)  # per _gateway.py instance

    @property
    def rate(self) -> float:
        return self.deliveries / self.wall if self.wall > 0 else float("nan")


@dataclass
class Connected:
    config: str
    sockets: int
    opened: int
    wall: float
    gateway_cpu: float
    redis_cpu: float
    loadgen_cpu: float
    gateway_rss_kib: int
    loadgen_rss_kib: int
    processes: int
    failures: int
    idle_gateway: float = float("nan")  # CPUs used by the gateways with every socket idle
    gc: list[dict[str, Any]] = field(default_factory=list)  # the gateways' collections meanwhile
    tracked: int | None = None  # objects the gateways' collectors track, once connected


class Machine:
    """CPU-time snapshots of every process class."""

    def __init__(self, gateways: Sequence[int], redis: int | None, loadgens: Sequence[int]):
        self.gateways, self.redis, self.loadgens = list(gateways), redis, list(loadgens)

    def snapshot(self) -> dict[str, Any]:
        return {
            "gateways": [common.cpu_seconds(pid) for pid in self.gateways],
            "redis": common.cpu_seconds(self.redis) if self.redis else 0.0,
            "loadgen": sum(common.cpu_seconds(pid) for pid in self.loadgens) + time.process_time(),
            "busy": common.machine_busy_seconds(),
        }

    @staticmethod
    def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        gateways = [a - b for a, b in zip(after["gateways"], before["gateways"], strict=True)]
        redis = after["redis"] - before["redis"]
        loadgen = after["loadgen"] - before["loadgen"]
        busy = after["busy"] - before["busy"]
        return {
            "gateways": gateways,
            "redis": redis,
            "loadgen": loadgen,
            "other": max(0.0, busy - sum(gateways) - redis - loadgen),
        }


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
    rss_idle = sum(common.rss_kib(pid)["VmRSS"] for pid in gateways.pids)
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
    failures = sum(a["failures"] for a in answers)
    rss = sum(common.rss_kib(pid)["VmRSS"] for pid in gateways.pids)
    connect_gc = [a["gc"] for a in await gateways.command("gc")]
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
        failures=failures,
        gc=connect_gc,
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
    if connect_gc:
        objects = await gateways.command("objects")
        connected.tracked = sum(a["objects"] for a in objects)
        print(
            f"  the gateways' cyclic GC meanwhile: {gc_text(connect_gc, wall)}; it now tracks "
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
            + " + ".join(f"{open_files(pid):,}" for pid in gateways.pids)
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
    if failures:
        first = next(a["failure"] for a in answers if a["failure"])
        print(f"  WARNING: {failures} clients could not connect; first error: {first}")
    if opened == 0:
        return connected, []

    connector = aiohttp.TCPConnector(limit=max(args.window, 1) * 2 * len(gateways.post_urls))
    auth = {"Authorization": aiohttp.encode_basic_auth(gateways.user, gateways.password)}
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
    phase_id = 0
    async with aiohttp.ClientSession(connector=connector) as session:

        async def run(phase: Phase) -> Result:
            nonlocal phase_id
            phase_id += 1
            expected_per = {"all": lambda lg: lg.n, "g10": lambda lg: lg.g10, "id": lambda lg: 1}
            for loadgen in loadgens:
                loadgen.send(
                    {"op": "phase", "p": phase_id, "expected": expected_per[phase.kind](loadgen)}
                )
            for loadgen in loadgens:
                await loadgen.reply("ready")
            tracker = tracker_box[0] = Tracker()
            window = asyncio.Semaphore(phase.window)
            tasks: set[asyncio.Task[None]] = set()
            if phase.kind == "all":
                targets = [lg for lg in loadgens if lg.n]
                audience_all: list[dict[str, Any]] = [{"all": True}]
            elif phase.kind == "g10":
                targets = [lg for lg in loadgens if lg.g10]
                audience_all = [{"g10": True}]
            expected_total = 0

            async def post(seq: int, audience: list[dict[str, Any]]) -> None:
                t = time.monotonic_ns()
                body = {"name": EVENT, "audience": audience, "seq": seq, "t": t, "p": phase_id}
                url = gateways.post_urls[seq % len(gateways.post_urls)]
                try:
                    async with session.post(url, json=body, headers=auth) as response:
                        await response.read()
                        ok = response.status == 204
                except aiohttp.ClientError:
                    ok = False
                tracker.post_times.append(time.monotonic_ns() - t)
                if not ok:
                    tracker.fail(seq)

            await gateways.command("gc")
            if gateways.profile and phase.name != "warm-up":
                for k, pid in enumerate(gateways.pids):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{gateways.profile}.{k}")
                    os.kill(pid, signal.SIGUSR1)
            before = machine.snapshot()
            started = time.monotonic_ns()
            deadline = started + int((phase.duration or 0) * 1e9)
            seq = 0
            while (phase.count is not None and seq < phase.count) or (
                phase.duration is not None and time.monotonic_ns() < deadline
            ):
                try:
                    await asyncio.wait_for(window.acquire(), args.drain)
                except TimeoutError:  # a message some socket never received: give up on it
                    tracker.stuck += 1
                    tracker.fail(min(tracker.pending))
                    await window.acquire()
                seq += 1
                if phase.kind == "id":
                    i = rng.randrange(n)
                    audience = [{"__id": listener_id(i)}]
                    tracker.expect(seq, 1, window.release)
                    expected_total += 1
                else:
                    audience = audience_all
                    tracker.expect(seq, len(targets), window.release)
                    expected_total += sum(lg.n if phase.kind == "all" else lg.g10 for lg in targets)
                task = asyncio.create_task(post(seq, audience))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tracker.idle.wait(), args.drain)
            if tasks:
                await asyncio.gather(*tasks)
            after = machine.snapshot()
            phase_gc = [a["gc"] for a in await gateways.command("gc")]
            if gateways.profile and phase.name != "warm-up":
                await save_profiles(gateways, f"{config}.{n}.{phase.name}")
            for loadgen in loadgens:
                loadgen.send({"op": "end"})
            ends = [await loadgen.reply("result") for loadgen in loadgens]
            last = max((e["last"] for e in ends), default=0) or time.monotonic_ns()
            used = Machine.delta(before, after)
            latencies = [v for e in ends for v in e["latencies"]]
            disconnected = sum(e["disconnected"] for e in ends)
            if disconnected:
                print(
                    f"  WARNING: {disconnected} clients were disconnected by the end of "
                    f"{phase.name!r} (python-engineio's client gives up after 30 s without a "
                    "ping from the gateway: the gateway's event loop fell that far behind)"
                )
            return Result(
                config=config,
                sockets=n,
                phase=phase,
                messages=seq,
                deliveries=sum(e["deliveries"] for e in ends),
                expected=expected_total,
                latencies=latencies,
                post_times=tracker.post_times,
                wall=(last - started) / 1e9,
                gateway_cpu=used["gateways"],
                redis_cpu=used["redis"],
                loadgen_cpu=used["loadgen"],
                other_cpu=used["other"],
                late=sum(e["late"] for e in ends),
                errors=tracker.errors,
                gc=phase_gc,
            )

        await run(Phase("warm-up", "all", 2, count=3))
        for phase in phases:
            result = await run(phase)
            results.append(result)
            print(f"    {phase.name}: {result.deliveries:,} deliveries", flush=True)
    return connected, results


async def save_profiles(gateways: Gateways, label: str) -> None:
    """SIGUSR2 each _gateway.py, wait for its stats, keep them as <profile>.<k>.<label>."""
    assert gateways.profile
    label = label.replace(",", "").replace("%", "pc").replace(" ", "-")
    for k, pid in enumerate(gateways.pids):
        os.kill(pid, signal.SIGUSR2)
        path = f"{gateways.profile}.{k}"
        for _ in range(200):
            await asyncio.sleep(0.05)
            if os.path.exists(path):
                os.replace(path, f"{path}.{label}")
                print(f"    profile of instance {k}: {path}.{label}")
                break


# -- reporting -------------------------------------------------------------------------------------

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
    "gateway CPU",
    "gateway µs/delivery",
    "gateway µs/message",
    "redis CPU",
    "loadgen CPU",
    "other CPU",
    "gateway GC: time (% of wall), full collections",
]


def gc_text(stats: list[dict[str, Any]], wall: float) -> str:
    """Collection time summed over the instances (and as a share of each instance's wall time),
    then the full collections (all instances) and the longest one."""
    if not stats:
        return "-"
    total = sum(sum(s["seconds"]) for s in stats)
    full = sum(s["collections"][2] for s in stats)
    longest = max(s["longest"][2] for s in stats)
    share = 100 * total / (wall * len(stats)) if wall > 0 else float("nan")
    text = f"{total:.2f} s ({share:.0f}%)"
    text += f", {full} full" + (f" (longest {longest:.2f} s)" if full else "")
    return text


def pct(seconds: float, wall: float) -> str:
    return f"{100 * seconds / wall:.0f}%" if wall > 0 else "-"


def result_row(r: Result) -> list[str]:
    median, p99, _, _ = common.summary(r.latencies)
    gw = sum(r.gateway_cpu)
    split = "+".join(f"{100 * c / r.wall:.0f}" for c in r.gateway_cpu) if r.wall > 0 else "-"
    missing = r.expected - r.deliveries
    return [
        r.phase.name,
        str(r.phase.window),
        f"{r.messages:,}",
        f"{r.deliveries:,}" + (f" ({missing:,} missing)" if missing > 0 else ""),
        f"{r.wall:.2f}",
        f"{r.rate:,.0f}",
        common.human_ns(median),
        common.human_ns(p99),
        common.human_ns(common.summary(r.post_times)[0]),
        (f"{split}%" if len(r.gateway_cpu) > 1 else pct(gw, r.wall)),
        f"{gw * 1e6 / r.deliveries:.1f}" if r.deliveries else "-",
        f"{gw * 1e6 / r.messages:.0f}" if r.messages else "-",
        pct(r.redis_cpu, r.wall),
        pct(r.loadgen_cpu, r.wall),
        pct(r.other_cpu, r.wall),
        gc_text(r.gc, r.wall),
    ]


def print_config(results: list[Result]) -> None:
    print(common.table(HEADERS, [result_row(r) for r in results]))
    busiest = max((100 * r.other_cpu / r.wall for r in results if r.wall >= 0.5), default=0)
    if busiest > 10:
        print(
            f"  WARNING: other processes used up to {busiest:.0f}% of a CPU during a phase; "
            "the figures are disturbed (the machine has 2 CPUs)"
        )
    late = sum(r.late for r in results)
    errors = sum(r.errors for r in results)
    if late or errors:
        print(f"  late or duplicate receipts: {late}, failed or abandoned messages: {errors}")


def summary_cell(r: Result | None, what: str) -> str:
    if r is None:
        return "-"
    if what == "rate":
        return f"{r.rate:,.0f}"
    median, p99, _, _ = common.summary(r.latencies)
    if what == "lat":
        return f"{common.human_ns(median)} / {common.human_ns(p99)}"
    gw = sum(r.gateway_cpu)
    return f"{gw * 1e6 / r.deliveries:.0f}" if r.deliveries else "-"


def signed_ns(ns: float) -> str:
    return ("-" if ns < 0 else "+") + common.human_ns(abs(ns))


def print_summary(connects: list[Connected], results: list[Result]) -> None:
    by = {(r.config, r.sockets, r.phase.name): r for r in results}
    rows = []
    for c in connects:

        def cell(phase: str, what: str, c: Connected = c) -> str:
            return summary_cell(by.get((c.config, c.sockets, phase)), what)

        rows.append(
            [
                c.config,
                f"{c.sockets:,}",
                f"{c.opened / c.wall:,.0f}/s ({c.wall:.1f} s)",
                f"{c.gateway_cpu * 1e3 / max(c.opened, 1):.2f}",
                cell("latency, 1 listener", "lat"),
                cell("latency, everyone", "lat"),
                cell("throughput, everyone", "rate"),
                cell("throughput, everyone", "lat"),
                cell("throughput, everyone", "cpu"),
                cell("throughput, 10%", "rate"),
                cell("throughput, 10%", "lat"),
            ]
        )
    print(
        common.table(
            [
                "config",
                "sockets",
                "connect+auth",
                "gw ms/conn",
                "1 listener p50 / p99",
                "everyone p50 / p99",
                "everyone deliveries/s",
                "everyone p50 / p99 (thr.)",
                "gw µs/delivery",
                "10% deliveries/s",
                "10% p50 / p99",
            ],
            rows,
        )
    )
    print()
    print("The Redis hop: 1-listener messages, one in flight (POST start to the client's handler)")
    hop_rows = []
    for sockets in sorted({c.sockets for c in connects}):
        base = by.get(("memory", sockets, "latency, 1 listener"))
        base_p50, base_p99 = (common.summary(base.latencies)[:2]) if base else (None, None)
        for config in CONFIGS:
            r = by.get((config, sockets, "latency, 1 listener"))
            if r is None:
                continue
            median, p99, _, mean = common.summary(r.latencies)
            added = (
                f"{signed_ns(median - base_p50)} / {signed_ns(p99 - base_p99)}"
                if base_p50 is not None and config != "memory"
                else "-"
            )
            gw = sum(r.gateway_cpu)
            hop_rows.append(
                [
                    config,
                    f"{sockets:,}",
                    f"{len(r.latencies):,}",
                    common.human_ns(median),
                    common.human_ns(p99),
                    common.human_ns(mean),
                    added,
                    common.human_ns(common.summary(r.post_times)[0]),
                    f"{gw * 1e6 / r.messages:.0f}" if r.messages else "-",
                    f"{r.redis_cpu * 1e6 / r.messages:.0f}" if r.messages else "-",
                ]
            )
    print(
        common.table(
            [
                "config",
                "sockets",
                "messages",
                "p50",
                "p99",
                "mean",
                "added p50 / p99",
                "POST p50",
                "gateway µs/message",
                "redis µs/message",
            ],
            hop_rows,
        )
    )


def git_state() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "bow_gateway"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        changed = [line[3:] for line in dirty if line.strip()]
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (f" + uncommitted changes in {', '.join(changed)}" if changed else "")


def main(argv: Sequence[str] | None = None) -> int:
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
        help="redis-x2 as two _gateway.py on two ports, or as `serve --workers 2` on one port",
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
        help="cProfile the _gateway.py instances per phase (not with --two workers); "
        "stats go to PREFIX.<instance>.<config>.<sockets>.<phase>",
    )
    parser.add_argument(
        "--gateway-gc",
        choices=("default", "freeze", "off"),
        default="default",
        help="EXPERIMENT: once every client is connected, gc.collect() + gc.freeze() ('freeze') "
        "or gc.disable() ('off') in each _gateway.py (which runs with gc_freeze on, as serve does)",
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.profile:
        args.profile = str(Path(args.profile).resolve())
    sizes = [int(s.replace("_", "")) for s in args.sockets.split(",") if s]
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configuration(s): {', '.join(sorted(unknown))}")

    soft, hard = raise_open_files_limit()
    need = max(sizes) + 1000
    if soft != resource.RLIM_INFINITY and soft < need:
        print(f"WARNING: RLIMIT_NOFILE is {soft} (hard {hard}): {max(sizes):,} sockets may not fit")
    print(common.environment(["aiohttp", "python-socketio", "python-engineio", "PyJWT", "redis"]))
    print(f"bow_gateway: {git_state()}")
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
                    common.wait_for_quiet(args.quiet)
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
        f"\nload average now: {common.load_average()}; whole run {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
