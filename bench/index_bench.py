"""Benchmark of the criteria index alone: build 1,000,000 listeners, then time resolve().

Run:  .venv/bin/python bench/index_bench.py [--listeners 1000000] [--seconds 1.0]

A plain script, not a test. It builds a ``CriteriaIndex`` the way the outbound fills it (criteria
as ``validate_criteria`` returns them, ``__id`` included; one socket per listener), reports the
build time and the memory it took, then times ``resolve()`` call by call for a few audiences and
prints the median and p99 of each. The targets of the issue are checked at the end: a 1-listener
audience under 20 µs, a 1% audience (10,000 sockets among 1,000,000) under 5 ms.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from lib import machine, proc, stats

from bow_gateway.core.index import CriteriaIndex

ROLES = ("admin", "editor", "author", "contributor", "subscriber")
ROLE_WEIGHTS = (0.005, 0.045, 0.15, 0.20, 0.60)  # admin is rare: ~5,000 of 1,000,000
_ROLE_BOUNDS = (*(sum(ROLE_WEIGHTS[: i + 1]) for i in range(len(ROLES) - 1)), 2.0)
BLOGS = 100_000


class FakeSocket:
    """Stands for an outbound ``Connection``: hashed by identity, as a slotted object is."""

    __slots__ = ("sid",)

    def __init__(self, sid: int) -> None:
        self.sid = sid


def listener_id(i: int) -> str:
    return f"user-{i:07d}"  # JWT ``sub`` claims are strings


def make_criteria(i: int, rng: random.Random) -> dict[str, Any]:
    """Criteria as ``validate_criteria`` returns them for listener ``i`` (``__id`` included).

    - ``role``: one of 5 values, skewed (admin 0.5%, subscriber 60%);
    - ``blogId``: a list of 1 to 3 blogs among 100,000 (so ~20 listeners per blog);
    - ``verified``: a boolean, true for ~70%;
    - ``premium``: true for exactly 10% (every 10th listener): the 10% audience;
    - ``beta``: true for exactly 1% (every 100th listener): the 1% audience.
    """
    draw = rng.random()
    role = next(r for r, bound in zip(ROLES, _ROLE_BOUNDS, strict=True) if draw < bound)
    blogs = {rng.randrange(BLOGS) for _ in range(1 + int(rng.random() * 3))}
    return {
        "role": role,
        "blogId": list(blogs),
        "verified": rng.random() < 0.7,
        "premium": i % 10 == 0,
        "beta": i % 100 == 0,
        "__id": listener_id(i),
    }


def expected_count(all_criteria: Sequence[dict[str, Any]], audience: list[dict[str, Any]]) -> int:
    """The size of an audience computed by brute force, to check what resolve() returns."""

    def matches(criteria: dict[str, Any], query: dict[str, Any]) -> bool:
        for key, value in query.items():
            have = criteria.get(key)
            if isinstance(have, list):
                if not any(type(v) is type(value) and v == value for v in have):
                    return False
            elif type(have) is not type(value) or have != value:
                return False
        return True

    return sum(1 for c in all_criteria if any(matches(c, q) for q in audience))


def time_calls(
    function: Callable[[], object], seconds: float, min_reps: int, max_reps: int
) -> list[int]:
    """Per-call durations in ns: warm up, then call until ``seconds`` or ``max_reps`` is reached."""
    for _ in range(min(10, min_reps)):
        function()
    clock = time.perf_counter_ns
    samples: list[int] = []
    deadline = clock() + int(seconds * 1e9)
    while len(samples) < max_reps and (len(samples) < min_reps or clock() < deadline):
        start = clock()
        function()
        samples.append(clock() - start)
    return samples


def timer_overhead_ns() -> float:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(100_000):
        start = clock()
        samples.append(clock() - start)
    return stats.summary(samples)[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--listeners", type=int, default=1_000_000, help="listeners (ids) to index")
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="time spent timing each audience (at least)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-check", action="store_true", help="skip the brute-force check of audience sizes"
    )
    args = parser.parse_args(argv)
    n = args.listeners
    if n < 1_000:
        parser.error("--listeners must be at least 1000")
    rng = random.Random(args.seed)

    print(machine.environment(["aiohttp", "python-socketio", "python-engineio", "marshmallow"]))
    print(f"gc thresholds: {gc.get_threshold()}, gc enabled: {gc.isenabled()}")
    print()
    all_criteria, index = build(n, rng)
    cases = audiences(all_criteria, n, rng)

    busy_before = proc.machine_busy_seconds()
    own_before = time.process_time()
    wall_before = time.perf_counter()
    overhead = timer_overhead_ns()
    print(f"timer overhead (perf_counter_ns pair, median): {overhead:.0f} ns, not subtracted")
    print()

    headers = ["audience", "sockets", "calls", "median", "p99", "min", "per socket", "target"]
    rows: list[list[str]] = []
    verdicts = []
    for name, make_audience, target in cases:
        row, verdict = time_case(args, index, all_criteria, name, make_audience, target)
        rows.append(row)
        if verdict is not None:
            verdicts.append(verdict)

    wall = time.perf_counter() - wall_before
    others = proc.machine_busy_seconds() - busy_before - (time.process_time() - own_before)
    print("CriteriaIndex.resolve() (bow_gateway/core/index.py):")
    print(stats.table(headers, rows))
    print()
    print(
        f"other processes used {100 * max(0.0, others) / wall:.0f}% of a CPU while resolve() "
        f"was timed; load average now: {machine.load_average()}"
    )
    print("targets (median): " + ("all met" if all(verdicts) else "SOME MISSED"))
    return 0 if all(verdicts) else 1


def build(n: int, rng: random.Random) -> tuple[list[dict[str, Any]], CriteriaIndex[FakeSocket]]:
    """``n`` listeners' criteria, and the index of them (one socket each); what it took."""
    rss_start = proc.rss_kib()["VmRSS"]
    started = time.perf_counter()
    all_criteria = [make_criteria(i, rng) for i in range(n)]
    sockets = [FakeSocket(i) for i in range(n)]
    generated = time.perf_counter() - started
    rss_data = proc.rss_kib()["VmRSS"]

    index: CriteriaIndex[FakeSocket] = CriteriaIndex()
    add = index.add
    started = time.perf_counter()
    for i in range(n):
        add(sockets[i], all_criteria[i]["__id"], all_criteria[i])
    build = time.perf_counter() - started
    rss_built = proc.rss_kib()
    assert len(index) == n

    data_mib = (rss_data - rss_start) / 1024
    index_mib = (rss_built["VmRSS"] - rss_data) / 1024
    print(f"listeners: {n:,} (one socket each); criteria generated in {generated:.1f} s")
    print(f"build: {build:.2f} s = {build / n * 1e6:.2f} µs per add() (gc enabled)")
    print(
        f"RSS: criteria + sockets {data_mib:,.0f} MiB, index on top {index_mib:,.0f} MiB "
        f"({index_mib * 1024 * 1024 / n:,.0f} B per listener), "
        f"process {rss_built['VmRSS'] / 1024:,.0f} MiB (peak {rss_built['VmHWM'] / 1024:,.0f} MiB)"
    )
    started = time.perf_counter()
    gc.collect()
    print(
        f"one full gc.collect() now: {time.perf_counter() - started:.2f} s "
        f"({len(gc.get_objects()):,} objects tracked by the gc)"
    )
    print()
    return all_criteria, index


Case = tuple[str, Callable[[], list[dict[str, Any]]], int | None]  # name, audience, target (ns)


def audiences(all_criteria: list[dict[str, Any]], n: int, rng: random.Random) -> list[Case]:
    """The audiences timed; they vary from call to call (random ids) so that no cache flatters
    them."""
    picks = [rng.randrange(n) for _ in range(1_024)]
    blog = all_criteria[rng.randrange(n)]["blogId"][0]  # a blog that has listeners
    cursor = [0]

    def pick() -> dict[str, Any]:
        cursor[0] = (cursor[0] + 1) & 1023
        return all_criteria[picks[cursor[0]]]

    def by_id_and_role() -> list[dict[str, Any]]:
        criteria = pick()
        return [{"__id": criteria["__id"], "role": criteria["role"]}]

    return [
        ("1 listener: [{__id}]", lambda: [{"__id": pick()["__id"]}], 20_000),
        ("1 listener: [{__id, role}]", by_id_and_role, None),
        (
            "3 queries: [{role: admin}, {role: author, blogId}, {__id}]",
            lambda: [
                {"role": "admin"},
                {"role": "author", "blogId": blog},
                {"__id": pick()["__id"]},
            ],
            None,
        ),
        ("1%: [{beta: true}]", lambda: [{"beta": True}], 5_000_000),
        ("10%: [{premium: true}]", lambda: [{"premium": True}], None),
        (
            "AND of 60% and 70%: [{role: subscriber, verified: true}]",
            lambda: [{"role": "subscriber", "verified": True}],
            None,
        ),
    ]


def time_case(
    args: argparse.Namespace,
    index: CriteriaIndex[FakeSocket],
    all_criteria: list[dict[str, Any]],
    name: str,
    make_audience: Callable[[], list[dict[str, Any]]],
    target: int | None,
) -> tuple[list[str], bool | None]:
    """One audience's row, and whether it met its target (None: it has none)."""
    sample_audience = make_audience()
    size = len(index.resolve(sample_audience))
    if not args.no_check:
        expected = expected_count(all_criteria, sample_audience)
        assert size == expected, f"{name}: resolve() gave {size}, brute force {expected}"
    varied = [make_audience() for _ in range(1_024)]
    samples = time_calls(
        _cycling(index.resolve, varied), args.seconds, min_reps=15, max_reps=200_000
    )
    median, p99, fastest, _ = stats.summary(samples)
    verdict = ""
    ok = None
    if target is not None:
        ok = median < target
        verdict = f"< {stats.human_ns(target)}: {'PASS' if ok else 'FAIL'}"
    row = [
        name,
        f"{size:,}",
        f"{len(samples):,}",
        stats.human_ns(median),
        stats.human_ns(p99),
        stats.human_ns(fastest),
        stats.human_ns(median / size) if size else "-",
        verdict,
    ]
    return row, ok


def _cycling(
    resolve: Callable[[list[dict[str, Any]]], object], audiences: list[list[dict[str, Any]]]
) -> Callable[[], object]:
    position = 0

    def call() -> object:
        nonlocal position
        position = (position + 1) & 1023
        return resolve(audiences[position])

    return call


if __name__ == "__main__":
    sys.exit(main())
