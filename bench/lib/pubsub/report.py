"""What ``stream_vs_pubsub.py`` prints: its three measurements, carrier by carrier."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from lib import stats
from lib.pubsub.measure import Measured
from lib.stats import signed_ns


def report(results: Sequence[Measured], args: argparse.Namespace) -> None:
    report_latency(results, args)
    report_throughput(results, args)
    report_dropped(results, args)


def report_latency(results: Sequence[Measured], args: argparse.Namespace) -> None:
    print()
    print(
        f"1. latency, one event in flight ({args.latency_events:,} events of {args.size} bytes; "
        "end to end = publish start to the subscriber's loop)"
    )
    rows = []
    base = next((r for r in results if r.variant == "pubsub"), None)
    for r in results:
        p50, p99, _, mean = stats.summary(r.latency_e2e)
        added = "-"
        if base is not None and r is not base:
            b50, b99 = stats.summary(base.latency_e2e)[:2]
            added = f"{signed_ns(p50 - b50)} / {signed_ns(p99 - b99)}"
        pub50, pub99, _, _ = stats.summary(r.latency_publish)
        rows.append(
            [
                r.variant,
                stats.human_ns(pub50),
                stats.human_ns(pub99),
                stats.human_ns(p50),
                stats.human_ns(p99),
                stats.human_ns(mean),
                added,
                f"{100 * r.latency_other:.0f}%",
            ]
        )
    print(
        stats.table(
            [
                "variant",
                "publish p50",
                "publish p99",
                "end-to-end p50",
                "end-to-end p99",
                "mean",
                "vs pubsub p50 / p99",
                "other CPU",
            ],
            rows,
        )
    )


def report_throughput(results: Sequence[Measured], args: argparse.Namespace) -> None:
    print()
    print(
        f"2. throughput ({args.events:,} events, at most {args.window} publishes in flight; "
        "CPU per event: this process (publisher + subscriber) and redis-server)"
    )
    rows = []
    for r in results:
        p50, p99, _, _ = stats.summary(r.thr_e2e)
        rows.append(
            [
                r.variant,
                f"{r.thr_events / r.thr_publish_wall:,.0f}",
                f"{r.thr_received / r.thr_delivery_wall:,.0f}",
                f"{r.thr_received:,}",
                stats.human_ns(p50),
                stats.human_ns(p99),
                f"{r.thr_own_cpu * 1e6 / r.thr_events:.1f}",
                f"{r.thr_redis_cpu * 1e6 / r.thr_events:.1f}",
                f"{100 * r.thr_other_cpu / r.thr_delivery_wall:.0f}%",
            ]
        )
    print(
        stats.table(
            [
                "variant",
                "published/s",
                "received/s",
                "received",
                "end-to-end p50",
                "end-to-end p99",
                "client µs/event",
                "redis µs/event",
                "other CPU",
            ],
            rows,
        )
    )


def report_dropped(results: Sequence[Measured], args: argparse.Namespace) -> None:
    print()
    print(
        f"3. dropped connection: {args.dropped} events published while the subscriber was cut off"
    )
    rows = [
        [
            r.variant,
            f"{r.dropped_received} of {r.dropped}",
            "yes" if r.dropped_received == r.dropped else "NO",
        ]
        for r in results
    ]
    print(stats.table(["variant", "received after reconnecting", "survives"], rows))
