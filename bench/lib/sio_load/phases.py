"""The phases of ``redis_bench.py``: this process POSTs, the load-generator processes count the
receipts and say when every socket of theirs that a message targets has it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from lib.gateways import Gateways
from lib.listeners import listener_id
from lib.proc import Machine
from lib.sio_load import EVENT


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
    gc: list[dict[str, Any]] = field(default_factory=list)  # per lib/gateway.py instance

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


@dataclass
class Sent:
    """What one phase sent: the messages, the deliveries they asked for, when it started."""

    started: int
    messages: int = 0
    expected: int = 0


class PhaseRunner:
    """Runs the phases of one configuration, one after the other, over one HTTP session."""

    def __init__(
        self,
        args: argparse.Namespace,
        config: str,
        n: int,
        gateways: Gateways,
        loadgens: list[Loadgen],
        tracker_box: list[Tracker],
        rng: random.Random,
        machine: Machine,
        session: aiohttp.ClientSession,
    ) -> None:
        self.args, self.config, self.n, self.gateways = args, config, n, gateways
        self.loadgens, self.tracker_box, self.rng = loadgens, tracker_box, rng
        self.machine, self.session = machine, session
        self.auth = {"Authorization": aiohttp.encode_basic_auth(gateways.user, gateways.password)}
        self.phase_id = 0

    async def run(self, phase: Phase) -> Result:
        self.phase_id += 1
        expected_per: dict[str, Callable[[Loadgen], int]] = {
            "all": lambda lg: lg.n,
            "g10": lambda lg: lg.g10,
            "id": lambda lg: 1,
        }
        for loadgen in self.loadgens:
            loadgen.send(
                {"op": "phase", "p": self.phase_id, "expected": expected_per[phase.kind](loadgen)}
            )
        for loadgen in self.loadgens:
            await loadgen.reply("ready")
        tracker = self.tracker_box[0] = Tracker()
        await self.gateways.command("gc")
        if self.gateways.profile and phase.name != "warm-up":
            for k, pid in enumerate(self.gateways.pids):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{self.gateways.profile}.{k}")
                os.kill(pid, signal.SIGUSR1)
        before = self.machine.snapshot()
        sent = await self.send(phase, tracker, Sent(time.monotonic_ns()))
        after = self.machine.snapshot()
        return await self.result(phase, tracker, sent, Machine.delta(before, after))

    async def post(self, tracker: Tracker, seq: int, audience: list[dict[str, Any]]) -> None:
        t = time.monotonic_ns()
        body = {"name": EVENT, "audience": audience, "seq": seq, "t": t, "p": self.phase_id}
        url = self.gateways.post_urls[seq % len(self.gateways.post_urls)]
        try:
            async with self.session.post(url, json=body, headers=self.auth) as response:
                await response.read()
                ok = response.status == 204
        except aiohttp.ClientError:
            ok = False
        tracker.post_times.append(time.monotonic_ns() - t)
        if not ok:
            tracker.fail(seq)

    async def send(self, phase: Phase, tracker: Tracker, sent: Sent) -> Sent:
        """The phase's messages, back to back within the window; then until all are received."""
        window = asyncio.Semaphore(phase.window)
        tasks: set[asyncio.Task[None]] = set()
        if phase.kind == "all":
            targets = [lg for lg in self.loadgens if lg.n]
            audience_all: list[dict[str, Any]] = [{"all": True}]
        elif phase.kind == "g10":
            targets = [lg for lg in self.loadgens if lg.g10]
            audience_all = [{"g10": True}]
        deadline = sent.started + int((phase.duration or 0) * 1e9)
        while (phase.count is not None and sent.messages < phase.count) or (
            phase.duration is not None and time.monotonic_ns() < deadline
        ):
            try:
                await asyncio.wait_for(window.acquire(), self.args.drain)
            except TimeoutError:  # a message some socket never received: give up on it
                tracker.stuck += 1
                tracker.fail(min(tracker.pending))
                await window.acquire()
            sent.messages += 1
            seq = sent.messages
            if phase.kind == "id":
                i = self.rng.randrange(self.n)
                audience = [{"__id": listener_id(i)}]
                tracker.expect(seq, 1, window.release)
                sent.expected += 1
            else:
                audience = audience_all
                tracker.expect(seq, len(targets), window.release)
                sent.expected += sum(lg.n if phase.kind == "all" else lg.g10 for lg in targets)
            task = asyncio.create_task(self.post(tracker, seq, audience))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(tracker.idle.wait(), self.args.drain)
        if tasks:
            await asyncio.gather(*tasks)
        return sent

    async def result(
        self, phase: Phase, tracker: Tracker, sent: Sent, used: dict[str, Any]
    ) -> Result:
        """Each load generator's receipts, and the phase's row."""
        phase_gc = [a["gc"] for a in await self.gateways.command("gc")]
        if self.gateways.profile and phase.name != "warm-up":
            await save_profiles(self.gateways, f"{self.config}.{self.n}.{phase.name}")
        for loadgen in self.loadgens:
            loadgen.send({"op": "end"})
        ends = [await loadgen.reply("result") for loadgen in self.loadgens]
        last = max((e["last"] for e in ends), default=0) or time.monotonic_ns()
        latencies = [v for e in ends for v in e["latencies"]]
        disconnected = sum(e["disconnected"] for e in ends)
        if disconnected:
            print(
                f"  WARNING: {disconnected} clients were disconnected by the end of "
                f"{phase.name!r} (python-engineio's client gives up after 30 s without a "
                "ping from the gateway: the gateway's event loop fell that far behind)"
            )
        return Result(
            config=self.config,
            sockets=self.n,
            phase=phase,
            messages=sent.messages,
            deliveries=sum(e["deliveries"] for e in ends),
            expected=sent.expected,
            latencies=latencies,
            post_times=tracker.post_times,
            wall=(last - sent.started) / 1e9,
            gateway_cpu=used["gateways"],
            redis_cpu=used["redis"],
            loadgen_cpu=used["loadgen"],
            other_cpu=used["other"],
            late=sum(e["late"] for e in ends),
            errors=tracker.errors,
            gc=phase_gc,
        )


async def save_profiles(gateways: Gateways, label: str) -> None:
    """SIGUSR2 each lib/gateway.py, wait for its stats, keep them as <profile>.<k>.<label>."""
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
