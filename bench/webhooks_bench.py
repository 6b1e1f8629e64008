"""The webhooks' figures (contract section 19): events a second to one local receiver, and the
latency from an event to its request at a steady rate, with the Redis store and the memory one.

Run:  .venv/bin/python bench/webhooks_bench.py                       # both stores, ~1.5 min
      .venv/bin/python bench/webhooks_bench.py --stores redis --burst 50000 --seconds 30
      .venv/bin/python bench/webhooks_bench.py --stores memory --profile /tmp/wh  # cProfile

A plain script, not a test. The gateway is ``lib/webhook_gateway.py`` (the quick-start gateway
with one ``[[webhooks]]`` table, ``max_concurrency`` ``--max-concurrency``) in a process of its
own pinned to ``--server-cpu``; this process, the receiver and the private redis-server run on
``--client-cpu``. The receiver is a minimal aiohttp server answering 204 that records each
request's arrival (wall clock), webhook-id and body; every ``--verify-every``-th request is
checked with the ``standardwebhooks`` library after the run, off the clock.

Per store: a warm-up burst, then ``--rounds`` times ``burst``: ``--burst`` events emitted as fast
as can be (``--batch`` per ``emit``): events a second from the first emit to the last request
received (the median of the rounds against the target); then ``pace``: ``--rate`` events a
second for ``--seconds`` s, each in an ``emit`` of its own: the latency from the event's time
(``data.t``, taken just before its ``emit``) to its request's arrival, p50/p99/max. Checked:
every webhook-id received exactly once, the samples verify. Printed too: the CPU of each process
and core (a core busier than the gateway: another process took it), and the gateway's CPU per
event (``CLOCK_PROCESS_CPUTIME_ID``), with the rate one whole core would give at that cost.
Targets (issue): at least 2,000 events/s; p99 under 250 ms at 500 events/s. The exit status is 1
when one is missed or a check fails. ``--profile PREFIX``: cProfile of the gateway during each
store's burst and pace, written to ``PREFIX.<store>.<burstN|pace>.prof``, its top functions printed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from lib import machine, proc, stats
from lib.private_redis import RedisServer, free_port
from standardwebhooks import Webhook as Verifier
from standardwebhooks import WebhookVerificationError

SCRIPT = Path(__file__).resolve().parent / "lib" / "webhook_gateway.py"
SECRET = "whsec_" + base64.b64encode(b"webhooks-bench-secret-0123456789").decode()
TARGET_RATE = 2_000.0
TARGET_P99_MS = 250.0


@dataclass
class Receiver:
    """One aiohttp receiver: 204 to everything, each request recorded, a sample kept whole."""

    verify_every: int
    port: int = field(default_factory=free_port)
    arrivals: list[tuple[float, str, bytes]] = field(default_factory=list)
    samples: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.arrivals.append((time.time(), request.headers["webhook-id"], body))
        if len(self.arrivals) % self.verify_every == 0:
            self.samples.append((body, dict(request.headers)))
        return web.Response(status=204)

    async def wait_for(self, count: int, timeout: float, settle: float = 0.5) -> None:
        """Until ``count`` requests came, then ``settle`` s more (a repeat would come then)."""
        deadline = time.monotonic() + timeout
        while len(self.arrivals) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(settle)

    def take(self) -> tuple[list[tuple[float, str, bytes]], list[tuple[bytes, dict[str, str]]]]:
        """What came since the last take."""
        arrivals, samples = self.arrivals, self.samples
        self.arrivals, self.samples = [], []
        return arrivals, samples


class Gateway:
    """``lib/webhook_gateway.py`` in its own process, pinned to ``cpu``; commands on stdin."""

    def __init__(self, url: str, redis: str | None, cpu: int, max_concurrency: int) -> None:
        line = [sys.executable, str(SCRIPT), "--url", url, "--secret", SECRET]
        line += ["--max-concurrency", str(max_concurrency)]
        if redis is not None:
            line += ["--redis", redis]
        if shutil.which("taskset"):
            line = ["taskset", "-c", str(cpu), *line]
        self.process = subprocess.Popen(line, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        if not first:
            raise SystemExit(f"the gateway did not start (exit status {self.process.wait(5)})")
        self.pid = int(json.loads(first)["pid"])

    async def command(self, text: str) -> dict[str, Any]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(text.encode() + b"\n")
        stdin.flush()
        line = await asyncio.get_running_loop().run_in_executor(None, stdout.readline)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()  # the end of its stdin stops it
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Usage:
    """CPU seconds of the gateway, this process (the receiver), redis-server and each core."""

    def __init__(self, gateway: int, redis: int | None) -> None:
        self.pids = {"gateway": gateway, "receiver": os.getpid()}
        if redis is not None:
            self.pids["redis"] = redis
        self.started = self.snapshot()

    def snapshot(self) -> tuple[float, dict[str, float], dict[int, tuple[float, float]]]:
        own = {name: proc.cpu_seconds(pid) for name, pid in self.pids.items()}
        return time.monotonic(), own, proc.cpu_busy()

    def text(self) -> str:
        """Each one's share of one CPU since the start."""
        (t0, own0, cores0), (t1, own1, cores1) = self.started, self.snapshot()
        wall = t1 - t0
        shares = [f"{name} {stats.pct(own1[name] - own0[name], wall)}" for name in own0]
        busy = proc.cpu_delta(cores0, cores1)
        shares += [f"CPU{cpu} busy {stats.pct(b[0], wall)}" for cpu, b in sorted(busy.items())]
        return ", ".join(shares)


def check(
    arrivals: list[tuple[float, str, bytes]], samples: list[tuple[bytes, dict[str, str]]], n: int
) -> list[str]:
    """What went wrong: not ``n`` distinct webhook-ids each once, a sample that fails to verify."""
    problems = []
    ids = [webhook_id for _, webhook_id, _ in arrivals]
    if len(set(ids)) != n:
        problems.append(f"{len(set(ids))} distinct webhook-ids, not {n}")
    if len(ids) != len(set(ids)):
        problems.append(f"{len(ids) - len(set(ids))} repeats")
    verifier = Verifier(SECRET)
    for body, headers in samples:
        try:
            verifier.verify(body, headers)
        except WebhookVerificationError as error:
            problems.append(f"a sample did not verify: {error!r}")
            break
    return problems


async def profiled(gateway: Gateway, prefix: str | None, name: str, text: str) -> dict[str, Any]:
    """``text``'s answer, the gateway under cProfile meanwhile when ``prefix`` asks for it."""
    if prefix is None:
        return await gateway.command(text)
    await gateway.command("profile")
    answer = await gateway.command(text)
    answer["profile"] = f"{prefix}.{name}.prof"
    return answer


async def stop_profile(gateway: Gateway, answer: dict[str, Any]) -> None:
    """Write and summarise the profile ``answer`` names, if any."""
    if "profile" in answer:
        await gateway.command(f"profile {answer['profile']}")
        print(f"  cProfile {answer['profile']} (top by own time):")
        pstats.Stats(answer["profile"]).sort_stats("tottime").print_stats(18)


async def burst_phase(
    gateway: Gateway, receiver: Receiver, args: argparse.Namespace, name: str, first: int
) -> tuple[float, list[str]]:
    """Events a second, emitted as fast as can be, from the first emit to the last request."""
    count = args.burst
    cpu0 = (await gateway.command("cpu"))["cpu_ns"]
    usage = Usage(gateway.pid, args.redis_pid)
    text = f"burst {first} {count} {args.batch}"
    answer = await profiled(gateway, args.profile, f"{name}.burst{first // 10**7}", text)
    await receiver.wait_for(count, timeout=max(60.0, count / 200), settle=0)
    print(f"  CPU during the burst: {usage.text()}")
    await asyncio.sleep(0.5)  # a repeat would come now
    cpu1 = (await gateway.command("cpu"))["cpu_ns"]
    await stop_profile(gateway, answer)
    arrivals, samples = receiver.take()
    last = max((at for at, _, _ in arrivals), default=float("nan"))
    rate = count / (last - answer["t0"])
    print(
        f"  burst: {count:,} events in {last - answer['t0']:.2f} s = {rate:,.0f} events/s "
        f"(emitted in {answer['t1'] - answer['t0']:.2f} s); gateway CPU "
        f"{(cpu1 - cpu0) / count / 1000:.0f} µs/event (one whole core: "
        f"{count * 1e9 / (cpu1 - cpu0):,.0f} events/s)"
    )
    return rate, check(arrivals, samples, count)


async def pace_phase(
    gateway: Gateway, receiver: Receiver, args: argparse.Namespace, name: str
) -> tuple[float, list[str]]:
    """Latency from each event's time to its request's arrival at ``--rate`` events a second."""
    count, first = int(args.rate * args.seconds), 10**9
    cpu0 = (await gateway.command("cpu"))["cpu_ns"]
    usage = Usage(gateway.pid, args.redis_pid)
    text = f"pace {first} {count} {args.rate}"
    answer = await profiled(gateway, args.profile, f"{name}.pace", text)
    await receiver.wait_for(count, timeout=30.0)
    print(f"  CPU while paced: {usage.text()}")
    cpu1 = (await gateway.command("cpu"))["cpu_ns"]
    await stop_profile(gateway, answer)
    arrivals, samples = receiver.take()
    ms = [1000 * (at - orjson.loads(body)["data"]["t"]) for at, _, body in arrivals]
    p50, p99 = stats.percentiles(ms)
    busy = (cpu1 - cpu0) / 1e9 / (answer["t1"] - answer["t0"])
    print(
        f"  pace {args.rate:g}/s x {args.seconds:g} s: {len(ms):,} requests, latency p50 "
        f"{p50:.1f} ms, p99 {p99:.1f} ms, max {max(ms, default=float('nan')):.1f} ms "
        f"(pacing late by {1000 * answer['late']:.1f} ms at most); gateway CPU {100 * busy:.0f}%"
    )
    return p99, check(arrivals, samples, count)


async def one_store(store: str, args: argparse.Namespace, redis_url: str | None) -> list[str]:
    """Both phases for ``store``; the targets missed and the checks failed."""
    receiver = Receiver(args.verify_every)
    await receiver.start()
    gateway = Gateway(receiver.url, redis_url, args.server_cpu, args.max_concurrency)
    print(f"{store} store (gateway pid {gateway.pid} on CPU {args.server_cpu}):")
    try:
        await gateway.command(f"burst 0 {args.warmup} {args.batch}")
        await receiver.wait_for(args.warmup, timeout=30.0)
        arrivals, samples = receiver.take()
        problems = [f"warm-up: {p}" for p in check(arrivals, samples, args.warmup)]
        rates = []
        for round_ in range(1, args.rounds + 1):
            rate, found = await burst_phase(gateway, receiver, args, store, round_ * 10**7)
            problems += [f"burst {round_}: {p}" for p in found]
            rates.append(rate)
        rate = statistics.median(rates)
        print(f"  burst, median of {len(rates)}: {rate:,.0f} events/s")
        if rate < TARGET_RATE:
            problems.append(f"burst: {rate:,.0f} events/s (median), under {TARGET_RATE:,.0f}")
        p99, found = await pace_phase(gateway, receiver, args, store)
        problems += [f"pace: {p}" for p in found]
        if not p99 < TARGET_P99_MS:
            problems.append(f"pace: p99 {p99:.1f} ms, not under {TARGET_P99_MS:g} ms")
    finally:
        gateway.stop()
        await receiver.stop()
    return [f"{store}: {p}" for p in problems]


async def run(args: argparse.Namespace) -> int:
    problems: list[str] = []
    print(f"load average before: {machine.load_average()}")
    for store in args.stores.split(","):
        if store == "redis":
            with RedisServer(cpu=args.client_cpu) as redis:
                args.redis_pid = redis.pid
                problems += await one_store(store, args, redis.url)
        else:
            args.redis_pid = None
            problems += await one_store(store, args, None)
    for problem in problems:
        print("MISSED:", problem)
    print("all targets met, all checks passed" if not problems else "")
    return 1 if problems else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="redis,memory", help="redis, memory or both")
    parser.add_argument("--burst", type=int, default=20_000, help="events of the burst")
    parser.add_argument("--rounds", type=int, default=3, help="bursts per store (median)")
    parser.add_argument("--batch", type=int, default=500, help="events per emit in the burst")
    parser.add_argument("--warmup", type=int, default=2_000, help="events of the warm-up burst")
    parser.add_argument("--rate", type=float, default=500.0, help="events a second when paced")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long paced")
    parser.add_argument("--max-concurrency", type=int, default=16, help="the webhook's table's")
    parser.add_argument("--verify-every", type=int, default=100, help="every Nth request checked")
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--profile", help="cProfile the gateway into PREFIX.<store>.<phase>.prof")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.client_cpu})
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
