"""The phases of ``fanout_bench.py``: messages POSTed to an audience, light or saturating, with
what the gateway, the load generator and the machine spent meanwhile."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import subprocess
import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lib import listeners, proc
from lib.gateways import Gateways
from lib.lean.books import EVENT, Books, Message, monotonic_ns
from lib.lean.posters import Posters
from lib.lean.websocket import LeanClient
from lib.proc import Machine

PHASE_KEYS = {
    "light, 1 listener": "light-1",
    "light, 10%": "light-10",
    "light, 100%": "light-100",
    "saturation, 1 listener": "sat-1",
    "saturation, 10%": "sat-10",
    "saturation, 100%": "sat-100",
}


@dataclass
class Phase:
    name: str
    audience: Callable[[], bytes]  # a new message's audience, as JSON
    expected: int  # sockets each message targets
    window: int
    duration: float | None = None  # seconds of sending, or
    count: int | None = None  # messages


@dataclass
class Result:
    phase: Phase
    messages: int
    expected: int
    latencies: array[int]
    post_times: array[int]
    wall: float  # s, first POST to last receipt
    cpu: dict[str, Any]  # Machine.delta: gateways, redis, loadgen, other (s)
    stall: float  # s, the gateway's longest event-loop stall
    gc_longest: float  # s, the gateway's longest garbage collection
    cores: list[tuple[float, float]]  # the gateway's core, the load generator's: (busy, softirq) s
    dropped: int  # sockets that saw their connection close
    gateway_drops: dict[str, float]  # disconnects the gateway counted, by reason
    late: int
    errors: int  # POSTs not answered 204, and messages given up on

    @property
    def deliveries(self) -> int:
        return len(self.latencies)

    @property
    def gateway_cpu(self) -> float:
        return float(sum(self.cpu["gateways"]))

    def rate_text(self) -> str:
        return f"{self.deliveries / self.wall:,.0f}/s" if self.wall > 0 else "-"


@dataclass
class Run:
    """One L: the gateway, its clients, and what they cost."""

    sockets: int
    gateways: Gateways
    port: int
    machine: Machine
    books: Books
    posters: Posters
    cores: tuple[int, int]  # CPUs of the gateway and of the load generator
    proto: int = 1  # the clients' Socket.IO protocol
    protocol: str = "socketio"  # the clients' wire protocol: socketio, flywheel or sse
    clients: list[LeanClient] = field(default_factory=list)
    spy: str = ""  # py-spy each phase into "{spy}-{phase}.txt" (raw collapsed stacks), if set
    spy_rate: int = 250
    seq: int = 0  # global: a frame is never mistaken for one of an earlier phase

    async def gateway(self, command: str) -> dict[str, Any]:
        return (await self.gateways.command(command))[0]


def disconnects(answer: dict[str, Any]) -> dict[str, float]:
    return dict(answer["sockets"]["disconnects"])


@dataclass
class Sending:
    """One phase's messages: each POSTed in a task of its own, at most ``window`` outstanding
    (not yet received by every socket it targets)."""

    run: Run
    window: asyncio.Semaphore
    post_times: array[int] = field(default_factory=lambda: array("q"))
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    errors: int = 0

    async def post(self, message: Message, audience: bytes) -> None:
        books = self.run.books
        body = b'{"name":"%s","audience":%s,"seq":%d,"t":%d}' % (
            EVENT.encode(),
            audience,
            message.seq,
            message.sent,
        )
        try:
            status = await self.run.posters.post(body)
        except OSError:
            status = 0
        self.post_times.append(monotonic_ns() - message.sent)
        if status != 204:
            self.errors += 1
            books.finish(message, books.last)

    async def send(self, phase: Phase, drain: float, started: int) -> int:
        """Send the phase's messages from ``started`` on; how many."""
        run, books, window = self.run, self.run.books, self.window
        deadline = started + int((phase.duration or 0) * 1e9)
        sent = 0
        while (phase.count is not None and sent < phase.count) or (
            phase.duration is not None and monotonic_ns() < deadline
        ):
            try:
                await asyncio.wait_for(window.acquire(), drain)
            except TimeoutError:  # a message some socket never received: give up on it
                self.errors += 1
                if books.pending:
                    books.finish(books.pending[min(books.pending)], books.last)
                await window.acquire()
            run.seq += 1
            sent += 1
            message = books.expect(run.seq, monotonic_ns(), phase.expected, window.release)
            task = asyncio.create_task(self.post(message, phase.audience()))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return sent


async def run_phase(run: Run, phase: Phase, drain: float) -> Result:
    books = run.books
    books.start_phase()
    sending = Sending(run, asyncio.Semaphore(phase.window))
    run.posters.grow(phase.window * 2)  # a 204 may come after the last receipt of its message
    gateway_before = disconnects(await run.gateway("sockets"))
    dropped_before = len(books.dropped)
    spy = None
    if run.spy and phase.name in PHASE_KEYS:
        spy = start_spy(run, f"{run.spy}-{PHASE_KEYS[phase.name]}.txt")
        await asyncio.sleep(1.0)  # py-spy attaches
    await run.gateway("stall")
    await run.gateway("gc")
    cpus_before = proc.cpu_busy()
    before = run.machine.snapshot()
    started = monotonic_ns()
    sent = await sending.send(phase, drain, started)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(books.idle.wait(), drain)
    if sending.tasks:
        await asyncio.gather(*sending.tasks)
    after = run.machine.snapshot()
    cpus = proc.cpu_delta(cpus_before, proc.cpu_busy())
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
        await asyncio.to_thread(spy.wait, 60)
    cores = [cpus.get(cpu, (0.0, 0.0)) for cpu in run.cores]
    stall = (await run.gateway("stall"))["stall"]["longest"]
    gc_longest = max((await run.gateway("gc"))["gc"]["longest"])
    gateway_after = disconnects(await run.gateway("sockets"))
    sending.errors += len(books.pending)
    for message in list(books.pending.values()):  # never complete: forget them
        books.finish(message, books.last)
    return Result(
        phase=phase,
        messages=sent,
        expected=sent * phase.expected,
        latencies=books.latencies,
        post_times=sending.post_times,
        wall=((books.last or monotonic_ns()) - started) / 1e9,
        cpu=Machine.delta(before, after),
        stall=stall,
        gc_longest=gc_longest,
        cores=cores,
        dropped=len(books.dropped) - dropped_before,
        gateway_drops={
            reason: count - gateway_before.get(reason, 0)
            for reason, count in gateway_after.items()
            if count > gateway_before.get(reason, 0)
        },
        late=books.late,
        errors=sending.errors,
    )


def start_spy(run: Run, path: str) -> subprocess.Popen[bytes]:
    """``py-spy record`` of the gateway (it must be in this Python's bin directory); it pauses
    the gateway at each sample: the CPU figures of a phase profiled are inflated."""
    command = [str(Path(sys.executable).parent / "py-spy"), "record", "-p"]
    command += [str(run.gateways.pids[0]), "-r", str(run.spy_rate), "-f", "raw", "-o", path]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def phases(args: argparse.Namespace, n: int, rng: random.Random) -> list[Phase]:
    in_group = sum(1 for i in range(n) if listeners.criteria(i)["g10"])

    def one() -> bytes:
        return b'[{"__id":"%s"}]' % listeners.listener_id(rng.randrange(n)).encode()

    def group() -> bytes:
        return b'[{"g10":true}]'

    def everyone() -> bytes:
        return b'[{"all":true}]'

    short, long = args.short_duration, args.duration
    return [
        Phase("light, 1 listener", one, 1, 1, count=args.light_one),
        Phase("light, 10%", group, in_group, 1, count=args.light_group),
        Phase("light, 100%", everyone, n, 1, count=args.light_all),
        Phase("saturation, 1 listener", one, 1, args.window_one, duration=short),
        Phase("saturation, 10%", group, in_group, args.window, duration=short),
        Phase("saturation, 100%", everyone, n, args.window, duration=long),
    ]
