"""What ``redis_bench.py`` prints: each configuration's phases, then a summary and the Redis hop."""

from __future__ import annotations

from typing import Any

from lib import stats
from lib.sio_load import CONFIGS
from lib.sio_load.phases import Connected, Result
from lib.stats import pct, signed_ns

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


def gc_text(gcs: list[dict[str, Any]], wall: float) -> str:
    """Collection time summed over the instances (and as a share of each instance's wall time),
    then the full collections (all instances) and the longest one."""
    if not gcs:
        return "-"
    total = sum(sum(s["seconds"]) for s in gcs)
    full = sum(s["collections"][2] for s in gcs)
    longest = max(s["longest"][2] for s in gcs)
    share = 100 * total / (wall * len(gcs)) if wall > 0 else float("nan")
    text = f"{total:.2f} s ({share:.0f}%)"
    text += f", {full} full" + (f" (longest {longest:.2f} s)" if full else "")
    return text


def result_row(r: Result) -> list[str]:
    median, p99, _, _ = stats.summary(r.latencies)
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
        stats.human_ns(median),
        stats.human_ns(p99),
        stats.human_ns(stats.summary(r.post_times)[0]),
        (f"{split}%" if len(r.gateway_cpu) > 1 else pct(gw, r.wall)),
        f"{gw * 1e6 / r.deliveries:.1f}" if r.deliveries else "-",
        f"{gw * 1e6 / r.messages:.0f}" if r.messages else "-",
        pct(r.redis_cpu, r.wall),
        pct(r.loadgen_cpu, r.wall),
        pct(r.other_cpu, r.wall),
        gc_text(r.gc, r.wall),
    ]


def print_config(results: list[Result]) -> None:
    print(stats.table(HEADERS, [result_row(r) for r in results]))
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
    median, p99, _, _ = stats.summary(r.latencies)
    if what == "lat":
        return f"{stats.human_ns(median)} / {stats.human_ns(p99)}"
    gw = sum(r.gateway_cpu)
    return f"{gw * 1e6 / r.deliveries:.0f}" if r.deliveries else "-"


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
        stats.table(
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
    print_hop(connects, by)


def print_hop(connects: list[Connected], by: dict[tuple[str, int, str], Result]) -> None:
    """The 1-listener latency of each configuration, and what it adds to ``memory``'s."""
    print("The Redis hop: 1-listener messages, one in flight (POST start to the client's handler)")
    hop_rows = []
    for sockets in sorted({c.sockets for c in connects}):
        base = by.get(("memory", sockets, "latency, 1 listener"))
        for config in CONFIGS:
            r = by.get((config, sockets, "latency, 1 listener"))
            if r is None:
                continue
            median, p99, _, mean = stats.summary(r.latencies)
            added = "-"
            if base is not None and config != "memory":
                base_p50, base_p99 = stats.summary(base.latencies)[:2]
                added = f"{signed_ns(median - base_p50)} / {signed_ns(p99 - base_p99)}"
            gw = sum(r.gateway_cpu)
            hop_rows.append(
                [
                    config,
                    f"{sockets:,}",
                    f"{len(r.latencies):,}",
                    stats.human_ns(median),
                    stats.human_ns(p99),
                    stats.human_ns(mean),
                    added,
                    stats.human_ns(stats.summary(r.post_times)[0]),
                    f"{gw * 1e6 / r.messages:.0f}" if r.messages else "-",
                    f"{r.redis_cpu * 1e6 / r.messages:.0f}" if r.messages else "-",
                ]
            )
    print(
        stats.table(
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
