"""``delivery_bench.py``'s load generator: python-socketio clients in this process, the books of
what they receive, and its phases (POSTs to an audience, one at a time or within a window)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import socketio

from lib import gateway, listeners, proc

AUTH = {"Authorization": aiohttp.encode_basic_auth(gateway.USER, gateway.PASSWORD)}
EVENT = "bench"


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


async def open_clients(url: str, count: int, concurrency: int) -> list[socketio.AsyncClient]:
    semaphore = asyncio.Semaphore(concurrency)
    clients: list[socketio.AsyncClient | None] = [None] * count

    async def open_one(i: int) -> None:
        client = socketio.AsyncClient(reconnection=False)
        client.on(EVENT, lambda data: Current.tracker.receive(data))
        token = listeners.token(i)
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

    user_before, sys_before = proc.cpu_times(server_pid)
    own_before = time.process_time()
    busy_before = proc.machine_busy_seconds()
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
    user_after, sys_after = proc.cpu_times(server_pid)
    server_cpu = user_after + sys_after - user_before - sys_before
    loadgen_cpu = time.process_time() - own_before
    busy = proc.machine_busy_seconds() - busy_before
    return Result(
        phase=phase,
        messages=seq,
        tracker=tracker,
        wall=(ended - started) / 1e9,
        server_cpu=server_cpu,
        server_sys=sys_after - sys_before,
        loadgen_cpu=loadgen_cpu,
        other_cpu=max(0.0, busy - server_cpu - loadgen_cpu),
        server_rss_kib=proc.rss_kib(server_pid)["VmRSS"],
    )
