"""The whole base (contract section 20): ``POST /_bow/reach`` latency over an audience index of a
million listeners, and a ``Bow-Fallback`` message's ``message.undelivered`` events for an audience
of 100,000 listeners of whom a tenth are connected and acknowledge.

Run:  .venv/bin/python bench/reach_bench.py                      # both parts, ~5 min
      .venv/bin/python bench/reach_bench.py --parts reach --queries 2000 --concurrency 4
      .venv/bin/python bench/reach_bench.py --parts fallback --profile /tmp/reach.prof

A plain script, not a test. A private redis-server (``lib/private_redis.py``) and this process on
``--client-cpu``, the gateway (``lib/gateway.py`` with a webhook in its ``--config``) on
``--server-cpu``. The index is written **in pure Python with pyroaring** (``lib/audience_index.py``,
the documented layout, with its criteria snapshot: the reader resolves ``__id`` through it), not by
the Spark criteria job, whose own timing is ``criteria_job_bench.py``'s.

**reach**: the index of ``--listeners`` (default 1,000,000) listeners of ``lib/criteria_data.py``'s
standard data (seed 1: plan, country, active, role[], blogId[]); one gateway on that Redis and
namespace; ``--queries`` (default 500) audiences of 1-3 queries of 1-3 predicates drawn from the
listeners' real criteria (a fifth with a value of another listener, a tenth by ``__id``), POSTed
``--concurrency`` at a time (default 1: sequentially, each after the last answer). Two passes of
the same audiences: the first with the gateway's bitmap cache cold, the second warm, and beside the
second, block by block (``BLOCK`` audiences to one, then to the other: the same moments of a shared
machine), the same audiences to ``/_bow/count`` (the ``online`` half of every reach answer: a round
of the instances through Redis, no index); last, ``AudienceIndex.matching`` alone in this process (a
reader of its own on the same Redis, no HTTP, no count: its own CPU), cold then warm. Each answer's
``listeners`` is checked against the count computed here from the same bitmaps. Latency p50, p99,
max per pass; gateway CPU per request and the longest event-loop stall of the gateway
(``lib/gateway.py``'s ``stall``: a high latency with no stall waited outside the gateway; a
long stall while it does little, as during ``/_bow/count``, is its CPU taken by another process).
Target: p99 < 50 ms. The gateway allows ``api.max_counts_per_second`` 1,000,000 (each reach is a
count: at the default 20 a second most requests would be answered 429) and
``outbound.max_connects_per_second`` 5,000 (``lib/reach_gateways.py``).

**fallback**: an index of ``--fallback-base`` (default 200,000) listeners ``bench-<i>`` of which
``--audience`` (default 100,000) hold ``{"cohort": 1}``; every tenth of those (10,000) connects as
a protocol-2 Socket.IO lean socket (``lib/lean``) whose token carries the same criteria, and
acknowledges (``43<id>[]``) the message. One message to ``[{"cohort": 1}]`` with ``Bow-Fallback:
--window`` (default 10); a local receiver verifies each webhook request. Measured: publish to the
last socket's copy, publish to the first and the last ``message.undelivered`` arrival; the
gateway's CPU per socket connected and from the window's end to the events, its longest stalls
before and after the window's end. Checked: ``/_bow/reach`` answers 100,000 listeners, 10,000
online; the union of the listed listeners is exactly the 90,000 not connected (none twice, none
connected), no ``left_out``. Target: the last event within the window + 5 s.

Exit status 1 when a target is missed or a check fails. ``--profile FILE``: cProfile of the
gateway for each pass or part, written to ``FILE.<name>``, top functions printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import redis
import redis.asyncio
from lib import machine, stats
from lib.audience_index import Audiences, write_index
from lib.criteria_data import expected_criteria, generate
from lib.private_redis import RedisServer
from lib.reach_fallback import AUTH, Outcome
from lib.reach_fallback import run as run_fallback
from lib.reach_gateways import Gateway
from pyroaring import BitMap

from bow_gateway.runtime.audience_index import AudienceIndex

NAMESPACE = "reach"
TARGET_P99_MS = 50.0
PASSES = {
    "cold": "reach, cold cache",
    "warm": "reach, warm cache",
    "count": "/_bow/count alone",
    "index cold": "index alone, cold",
    "index warm": "index alone, warm",
}
MARGIN_S = 5.0
BLOCK = 50
"""Audiences per block: the warm pass and the count pass alternate block by block."""
Rows = list[list[object]]


class Expected:
    """What an audience's ``listeners`` must be, from the bitmaps the index was written from."""

    def __init__(self, bitmaps: dict[str, BitMap], ids: Sequence[Any], criteria: Sequence[Any]):
        from bow_gateway.core.audience_layout import pair_token

        self.pair_token = pair_token
        self.bitmaps = bitmaps
        self.criteria = criteria
        self.numbers = {listener_id: n for n, listener_id in enumerate(ids)}

    def count(self, audience: list[dict[str, Any]]) -> int:
        found = BitMap()
        for query in audience:
            predicates = {k: v for k, v in query.items() if k != "__id"}
            if "__id" in query:
                n = self.numbers.get(query["__id"])
                if n is not None and all(self._holds(n, k, v) for k, v in predicates.items()):
                    found.add(n)
                continue
            maps = [
                self.bitmaps.get(self.pair_token(k, v), BitMap()) for k, v in predicates.items()
            ]
            found |= BitMap.intersection(*maps) if len(maps) > 1 else maps[0]
        return len(found)

    def _holds(self, n: int, key: str, value: Any) -> bool:
        held = self.criteria[n].get(key)
        items = held if isinstance(held, list) else [held]
        return any(item == value and type(item) is type(value) for item in items)


async def one_pass(
    http: aiohttp.ClientSession,
    gateway: Gateway,
    bodies: list[dict[str, Any]],
    expected: list[int] | None,
    concurrency: int,
    path: str = "/_bow/reach",
) -> tuple[list[float], list[str], float, float]:
    """Every audience POSTed to ``path``, ``concurrency`` at a time: each one's latency (ms, in
    the order of ``bodies``), problems (``expected``: each answer's ``listeners``), the gateway's
    CPU (s) and its longest event-loop stall (s) meanwhile."""
    room = asyncio.Semaphore(concurrency)
    latencies = [float("nan")] * len(bodies)
    problems: list[str] = []

    async def one(n: int) -> None:
        body, want = bodies[n], None if expected is None else expected[n]
        async with room:
            started = time.perf_counter()
            async with http.post(gateway.url + path, json=body, headers=AUTH) as answer:
                status, text = answer.status, await answer.text()
            latencies[n] = 1000 * (time.perf_counter() - started)
        document = json.loads(text) if status == 200 else {}
        if status != 200 or (want is not None and document.get("listeners") != want):
            problems.append(f"{body['audience']}: {status} {text[:300]}, want {want} listeners")

    cpu0 = await gateway.cpu()
    await gateway.command("stall")  # resets the longest event-loop stall
    await asyncio.gather(*(one(n) for n in range(len(bodies))))
    stall = float((await gateway.command("stall"))["stall"]["longest"])
    cpu = await gateway.cpu() - cpu0
    return latencies, problems, cpu, stall


@dataclass
class Result:
    """One kind of request's figures, over every block it ran in."""

    latencies: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    cpu: float = 0.0
    stall: float = 0.0


async def measure(
    http: aiohttp.ClientSession,
    gateway: Gateway,
    result: Result,
    bodies: list[dict[str, Any]],
    expected: list[int] | None,
    concurrency: int,
) -> None:
    """``one_pass`` to ``/_bow/reach`` (``/_bow/count`` without ``expected``), into ``result``."""
    path = "/_bow/reach" if expected is not None else "/_bow/count"
    latencies, found, cpu, stall = await one_pass(
        http, gateway, bodies, expected, concurrency, path
    )
    result.latencies += latencies
    result.problems += found
    result.cpu += cpu
    result.stall = max(result.stall, stall)


async def index_alone(url: str, bodies: list[dict[str, Any]]) -> dict[str, list[float]]:
    """``AudienceIndex.matching`` of every audience in this process (no HTTP, no count), with a
    reader of its own: cold, then warm; latencies in ms."""
    client = redis.asyncio.Redis.from_url(url, decode_responses=False)
    index = AudienceIndex(client, NAMESPACE)
    passes: dict[str, list[float]] = {}
    for name in ("index cold", "index warm"):
        latencies = passes[name] = []
        for body in bodies:
            started = time.perf_counter()
            await index.matching(body["audience"])
            latencies.append(1000 * (time.perf_counter() - started))
    await client.aclose()
    return passes


def pass_row(
    name: str,
    latencies: list[float],
    bodies: list[dict[str, Any]],
    result: Result | None,
    quiet: bool,
) -> list[object]:
    """The table's row of a pass (the slowest audiences printed unless ``quiet``)."""
    p50, p99 = stats.percentiles(latencies)
    peak = max(latencies)
    if not quiet:
        print(f"  {PASSES[name]}: p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {peak:.1f} ms; slowest:")
        for n in sorted(range(len(bodies)), key=latencies.__getitem__)[-3:]:
            print(f"    {latencies[n]:.1f} ms {json.dumps(bodies[n]['audience'])[:150]}")
    if result is None:
        return [PASSES[name], f"{p50:.1f}", f"{p99:.1f}", f"{peak:.1f}", "-", "-"]
    cpu = f"{1000 * result.cpu / len(latencies):.2f}"
    return [
        PASSES[name],
        f"{p50:.1f}",
        f"{p99:.1f}",
        f"{peak:.1f}",
        cpu,
        f"{1000 * result.stall:.0f}",
    ]


def write_standard(url: str, listeners: int) -> tuple[list[Any], list[Any], dict[str, BitMap]]:
    """The standard data set's index, written; its ids, criteria and bitmaps."""
    started = time.monotonic()
    data = expected_criteria(generate(listeners, seed=1))
    ids, criteria = list(data), list(data.values())
    print(f"  data set of {len(ids):,} listeners in {time.monotonic() - started:.1f} s")
    started = time.monotonic()
    client = redis.Redis.from_url(url)
    pointer, bitmaps = write_index(client, NAMESPACE, "r1", ids, criteria)
    memory = client.info("memory")["used_memory_human"]
    print(
        f"  index written in {time.monotonic() - started:.1f} s: {pointer.pairs:,} pairs, "
        f"{pointer.members:,} listener-pairs; Redis {memory}"
    )
    return ids, criteria, bitmaps


async def reach_part(args: argparse.Namespace, url: str) -> tuple[Rows, list[str]]:
    ids, criteria, bitmaps = write_standard(url, args.listeners)
    audiences = Audiences(ids, criteria)
    bodies = [{"audience": audiences.audience()} for _ in range(args.queries)]
    expected_of = Expected(bitmaps, ids, criteria)
    expected = [expected_of.count(body["audience"]) for body in bodies]
    del bitmaps, expected_of
    print(
        f"  {len(bodies)} audiences, {sum(len(b['audience']) for b in bodies)} queries; "
        f"listeners matched: median {stats.percentile(expected, 0.5):,.0f}, "
        f"max {max(expected):,}, none {expected.count(0)}"
    )
    gateway = Gateway(url, NAMESPACE, args.server_cpu, profile=args.profile)
    results: dict[str, Result] = {name: Result() for name in ("cold", "warm", "count")}
    try:
        async with aiohttp.ClientSession() as http:
            gateway.start_profile()
            await measure(http, gateway, results["cold"], bodies, expected, args.concurrency)
            await gateway.stop_profile("reach.cold")
            gateway.start_profile()
            for start in range(0, len(bodies), BLOCK):  # warm and count side by side
                part = slice(start, start + BLOCK)
                for name in ("warm", "count"):
                    want = expected[part] if name == "warm" else None
                    await measure(
                        http, gateway, results[name], bodies[part], want, args.concurrency
                    )
            await gateway.stop_profile("reach.warm+count")
    finally:
        gateway.stop()
    rows: Rows = []
    problems: list[str] = []
    for name, result in results.items():
        rows.append(pass_row(name, result.latencies, bodies, result, args.quiet))
        problems += [f"reach {name}: {p}" for p in result.problems[:5]]
        if len(result.problems) > 5:
            problems.append(f"reach {name}: {len(result.problems) - 5} more wrong answers")
        p99 = stats.percentiles(result.latencies)[1]
        if name != "count" and not p99 < TARGET_P99_MS:
            problems.append(f"reach {name}: p99 {p99:.1f} ms, not under {TARGET_P99_MS} ms")
    for name, latencies in (await index_alone(url, bodies)).items():
        rows.append(pass_row(name, latencies, bodies, None, args.quiet))
    return rows, problems


def fallback_rows(outcome: Outcome, window: int, audience: int) -> tuple[Rows, list[str]]:
    problems = list(outcome.problems or [])
    want = (audience, outcome.connected)
    if (
        outcome.reach is None
        or (outcome.reach.get("listeners"), outcome.reach.get("online")) != want
    ):
        problems.append(f"fallback: /_bow/reach answered {outcome.reach}, want {want}")
    if not outcome.last_event_s <= window + MARGIN_S:
        problems.append(
            f"fallback: last event {outcome.last_event_s:.2f} s after publish, "
            f"not within {window} + {MARGIN_S:g} s"
        )
    rows: Rows = [
        ["sockets connected", f"{outcome.connected:,}", f"{outcome.connect_seconds:.1f} s"],
        ["gateway CPU per socket connected", f"{outcome.connect_cpu_ms:.2f} ms", ""],
        ["reach: listeners / online", reached(outcome.reach), ""],
        ["publish -> last socket's copy", f"{outcome.delivered_ms:.0f} ms", ""],
        ["publish -> first undelivered event", f"{outcome.first_event_s:.2f} s", ""],
        [
            "publish -> last undelivered event",
            f"{outcome.last_event_s:.2f} s",
            f"<= {window + MARGIN_S:g} s",
        ],
        ["events / listeners listed", f"{outcome.events} / {outcome.listed:,}", ""],
        ["gateway CPU, receipt end -> events", f"{outcome.undelivered_cpu_s:.2f} s", ""],
        ["gateway's longest stall, publish -> S s", f"{outcome.stall_ms:.0f} ms", ""],
        ["gateway's longest stall, S s -> events", f"{outcome.events_stall_ms:.0f} ms", ""],
        ["checks", "ok" if not outcome.problems else "FAILED", ""],
    ]
    return rows, problems


def reached(answer: dict[str, Any] | None) -> str:
    if not answer or "listeners" not in answer:
        return str(answer)
    return f"{answer['listeners']:,} / {answer['online']:,}"


async def run(args: argparse.Namespace) -> int:
    print(machine.environment(["bow_gateway", "pyroaring", "redis", "aiohttp"]))
    parts = args.parts.split(",")
    problems: list[str] = []
    tables: list[str] = []
    with RedisServer(cpu=args.client_cpu) as server:
        print(f"redis-server {server.version()} pid {server.pid}")
        if "reach" in parts:
            print(f"reach ({args.concurrency} request(s) at a time):")
            rows, found = await reach_part(args, server.url)
            problems += found
            headers = ["pass", "p50 ms", "p99 ms", "max ms", "gateway CPU ms/req", "stall ms"]
            tables.append(stats.table(headers, rows))
            server.flush()
        if "fallback" in parts:
            print(f"fallback (audience {args.audience:,} of {args.fallback_base:,}):")
            outcome = await run_fallback(
                server.url,
                args.fallback_base,
                args.audience,
                args.window,
                args.server_cpu,
                args.profile,
            )
            rows, found = fallback_rows(outcome, args.window, args.audience)
            problems += found
            tables.append(stats.table(["fallback", "figure", "target"], rows))
    print(f"\nload average at the end: {machine.load_average()}")
    for table in tables:
        print("\n" + table)
    for problem in problems:
        print("MISSED:", problem)
    print("\nall targets met, all checks passed" if not problems else "")
    return 1 if problems else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="reach,fallback", help="reach, fallback or both")
    parser.add_argument("--listeners", type=int, default=1_000_000, help="reach: the base")
    parser.add_argument("--queries", type=int, default=500, help="reach: audiences per pass")
    parser.add_argument("--concurrency", type=int, default=1, help="reach: requests at a time")
    parser.add_argument("--fallback-base", type=int, default=200_000, help="fallback: the base")
    parser.add_argument("--audience", type=int, default=100_000, help="fallback: cohort 1")
    parser.add_argument("--window", type=int, default=10, help="fallback: Bow-Fallback seconds")
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--profile", help="cProfile the gateway into FILE.<pass>")
    parser.add_argument("--quiet", action="store_true", help="only the tables and verdicts")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.client_cpu})
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
