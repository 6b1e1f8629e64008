"""What ``fanout_bench.py`` prints: each phase's row, the target, the summary of every L and
variant, and the variants against one another over the rounds."""

from __future__ import annotations

from lib import stats
from lib.fanout.phases import Result
from lib.fanout.run import Connected
from lib.stats import median_range, pct, percentiles
from lib.variants import Variant

TARGET_SOCKETS, TARGET_STALL, TARGET_P99 = 10_000, 0.100, 1e9  # the 100% target (s, ns)


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
    "gw µs/delivery",
    "gw µs/message",
    "loadgen CPU",
    "loadgen µs/delivery",
    "redis CPU",
    "other CPU",
    "gateway core busy (softirq)",
    "loadgen core busy (softirq)",
    "longest stall",
    "longest GC",
    "dropped (client/gateway)",
]


def result_row(r: Result) -> list[str]:
    median, p99 = percentiles(r.latencies)
    gw, loadgen = r.gateway_cpu, r.cpu["loadgen"]
    missing = r.expected - r.deliveries
    gateway_dropped = sum(r.gateway_drops.values())
    return [
        r.phase.name,
        str(r.phase.window),
        f"{r.messages:,}",
        f"{r.deliveries:,}" + (f" ({missing:,} missing)" if missing > 0 else ""),
        f"{r.wall:.2f}",
        f"{r.deliveries / r.wall:,.0f}" if r.wall > 0 else "-",
        stats.human_ns(median),
        stats.human_ns(p99),
        stats.human_ns(stats.percentile(sorted(r.post_times), 0.5)),
        pct(gw, r.wall),
        f"{gw * 1e6 / r.deliveries:.1f}" if r.deliveries else "-",
        f"{gw * 1e6 / r.messages:.0f}" if r.messages else "-",
        pct(loadgen, r.wall),
        f"{loadgen * 1e6 / r.deliveries:.1f}" if r.deliveries else "-",
        pct(r.cpu["redis"], r.wall),
        pct(r.cpu["other"], r.wall),
        *(f"{pct(busy, r.wall)} ({pct(softirq, r.wall)})" for busy, softirq in r.cores),
        stats.human_ns(r.stall * 1e9),
        stats.human_ns(r.gc_longest * 1e9),
        f"{r.dropped}/{gateway_dropped:.0f}",
    ]


def print_results(n: int, results: list[Result]) -> None:
    print(stats.table(HEADERS, [result_row(r) for r in results]))
    for r in results:
        if r.gateway_drops:
            print(f"  {r.phase.name}: the gateway disconnected {r.gateway_drops}")
    late = sum(r.late for r in results)
    errors = sum(r.errors for r in results)
    if late or errors:
        print(f"  late or duplicate receipts: {late}; failed POSTs or abandoned messages: {errors}")
    busiest = max((100 * r.cpu["other"] / r.wall for r in results if r.wall >= 0.5), default=0)
    if busiest > 10:
        print(
            f"  WARNING: other processes used up to {busiest:.0f}% of a CPU during a phase; "
            "the figures are disturbed (the machine has 2 CPUs)"
        )


def check_target(n: int, results: list[Result]) -> None:
    """The issue's target: 100% at 10,000 for 30 s, no drop, stall < 100 ms, p99 < 1 s."""
    if n != TARGET_SOCKETS:
        return
    r = next(r for r in results if r.phase.name == "saturation, 100%")
    _, p99 = percentiles(r.latencies)
    dropped = r.dropped + sum(r.gateway_drops.values())
    checks = [
        (f"{r.phase.duration:g} s of sending (30 s asked)", (r.phase.duration or 0) >= 30),
        (f"{dropped:.0f} sockets dropped", dropped == 0),
        (f"longest stall {stats.human_ns(r.stall * 1e9)} (< 100 ms)", r.stall < TARGET_STALL),
        (f"p99 {stats.human_ns(p99)} (< 1 s)", p99 < TARGET_P99),
    ]
    verdict = "MET" if all(ok for _, ok in checks) else "MISSED"
    text = "; ".join(f"{what}: {'ok' if ok else 'NO'}" for what, ok in checks)
    print(f"  target (100% audience at 10,000 listeners, back to back): {verdict}: {text}")


def print_summary(runs: list[tuple[Connected, list[Result]]], names: list[str]) -> None:
    rows = []
    for (c, results), name in zip(runs, names, strict=True):
        by = {r.phase.name: r for r in results}

        def cell(name: str, what: str, by: dict[str, Result] = by) -> str:
            r = by.get(name)
            if r is None or not r.deliveries:
                return "-"
            if what == "rate":
                return f"{r.deliveries / r.wall:,.0f}" if r.wall > 0 else "-"
            if what == "cpu":
                return f"{r.gateway_cpu * 1e6 / r.deliveries:.1f}"
            median, p99 = percentiles(r.latencies)
            return f"{stats.human_ns(median)} / {stats.human_ns(p99)}"

        rows.append(
            [
                name,
                f"{c.sockets:,}",
                f"{c.rate:,.0f}/s",
                f"{c.rss_per_socket_kib:.1f}",
                *(cell(f"light, {a}", "lat") for a in ("1 listener", "10%", "100%")),
                *(cell(f"saturation, {a}", "rate") for a in ("1 listener", "10%", "100%")),
                *(cell(f"saturation, {a}", "cpu") for a in ("1 listener", "10%", "100%")),
                cell("saturation, 100%", "lat"),
                f"{max((r.stall for r in results), default=0) * 1e3:.0f} ms",
                f"{sum(r.dropped for r in results)}/"
                f"{sum(sum(r.gateway_drops.values()) for r in results):.0f}",
            ]
        )
    headers = ["gateway, clients", "L", "connect+auth", "KiB/conn"]
    headers += [f"light p50/p99 {a}" for a in ("1", "10%", "100%")]
    headers += [f"sat. deliveries/s {a}" for a in ("1", "10%", "100%")]
    headers += [f"gw µs/delivery {a}" for a in ("1", "10%", "100%")]
    headers += ["sat. 100% p50/p99", "longest stall", "dropped (client/gateway)"]
    print(stats.table(headers, rows))


def print_comparison(
    runs: list[tuple[Connected, list[Result]]],
    keys: list[tuple[int, int, Variant]],
    tried: list[Variant],
) -> None:
    """Gateway CPU per delivery of every variant against the first, round by round."""
    first = tried[0]
    by: dict[tuple[int, int, Variant], dict[str, Result]] = {
        key: {r.phase.name: r for r in results}
        for key, (_, results) in zip(keys, runs, strict=True)
    }
    rows = []
    for (n, round_, variant), results in by.items():
        if variant == first:
            continue
        base = by.get((n, round_, first), {})
        for name, r in results.items():
            b = base.get(name)
            if b is None or not r.deliveries or not b.deliveries:
                continue
            mine, theirs = r.gateway_cpu / r.deliveries, b.gateway_cpu / b.deliveries
            rows.append(
                [
                    f"{n:,}",
                    str(round_ + 1),
                    name,
                    f"{theirs * 1e6:.1f}",
                    variant.name,
                    f"{mine * 1e6:.1f}",
                    f"{mine / theirs:.2f}" if theirs else "-",
                    f"{b.deliveries / b.wall:,.0f} / {r.deliveries / r.wall:,.0f}",
                ]
            )
    print(f"Gateway CPU per delivery, each variant against {first.name} of the same round:")
    headers = ["L", "round", "phase", f"{first.name} µs", "variant", "its µs", "ratio"]
    headers.append("deliveries/s (first / variant)")
    print(stats.table(headers, rows))


def print_medians(
    runs: list[tuple[Connected, list[Result]]],
    keys: list[tuple[int, int, Variant]],
    tried: list[Variant],
    max_other: float | None = None,
) -> None:
    """Per variant and phase, over the rounds: the gateway's µs per delivery (median, range),
    and its ratio to each Socket.IO variant of the first gateway in the same round (median and
    range of the per-round ratios: each compares runs minutes apart, under the same load).
    With ``max_other`` (% of a CPU), the phases during which other processes used more are
    left out (of the ratios too)."""
    per: dict[tuple[int, Variant, str], dict[int, float]] = {}
    others: dict[tuple[int, Variant, str], list[float]] = {}
    rounds: dict[tuple[int, Variant, str], int] = {}
    for (n, round_, variant), (_, results) in zip(keys, runs, strict=True):
        for r in results:
            if not r.deliveries or r.wall <= 0:
                continue
            key = (n, variant, r.phase.name)
            rounds[key] = rounds.get(key, 0) + 1
            other = 100 * r.cpu["other"] / r.wall
            if max_other is not None and other > max_other:
                continue
            per.setdefault(key, {})[round_] = r.gateway_cpu * 1e6 / r.deliveries
            others.setdefault(key, []).append(other)
    references = [v for v in tried if v.protocol == "socketio" and v.source == tried[0].source]
    rows = []
    for (n, variant, phase), values in per.items():
        row = [
            f"{n:,}",
            variant.name,
            phase,
            f"{len(values)} of {rounds[n, variant, phase]}",
            median_range(others[n, variant, phase], "{:.0f}%"),
            median_range(list(values.values())),
        ]
        for reference in references:
            theirs = per.get((n, reference, phase), {})
            ratios = [mine / theirs[k] for k, mine in values.items() if theirs.get(k)]
            row.append("-" if reference == variant else median_range(ratios, "{:.2f}"))
        rows.append(row)
    print("Gateway µs per delivery over the rounds, median (min-max), and its ratio to each")
    print("Socket.IO variant of the first gateway, round by round (median of the ratios, min-max)")
    if max_other is not None:
        print(f"(phases during which other processes used over {max_other:g}% of a CPU left out):")
    headers = ["L", "variant", "phase", "rounds", "other CPU", "µs/delivery"]
    headers += [f"/ {reference.name}" for reference in references]
    print(stats.table(headers, rows))
