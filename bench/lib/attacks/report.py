"""One window of ``attack_bench.py`` (the baseline, or an attack until it is over and all has
settled), its row and the table of them all."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lib import proc, stats
from lib.attacks import MB, STILL_OPEN, TARGET_LOG_BYTES, TARGET_RSS_MB, TARGET_STALL_MS
from lib.attacks.probe import Probe
from lib.attacks.served import Gateway, wait_until_idle


@dataclass
class Row:
    name: str
    probe: dict[str, Any]
    rss_mb: float
    kept_mb: float
    log_bytes: int
    log_lines: int
    longest_line: int
    cpu: float
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)

    def misses(self) -> list[str]:
        missed = []
        if not self.probe["stall"] < TARGET_STALL_MS:  # NaN: nothing arrived
            missed.append("stall")
        if self.probe["lost"]:
            missed.append("lost")
        if self.rss_mb >= TARGET_RSS_MB:
            missed.append("RSS")
        if self.log_bytes >= TARGET_LOG_BYTES:
            missed.append("log")
        if sum(self.details.get(STILL_OPEN, {}).values()):
            missed.append("held open")
        return missed


async def measure(
    name: str,
    probe: Probe,
    gw: Gateway,
    args: argparse.Namespace,
    attack: asyncio.Future[dict[str, Any]] | None,
) -> Row:
    """One window: from now until ``attack`` is done (or ``--baseline`` s) and all settled."""
    rss0 = gw.rss_kib()
    peak_reset = gw.reset_peak()
    log0, cpu0 = gw.log_size(), proc.cpu_seconds(gw.pid)
    first, started = probe.seq, time.monotonic()
    sampled = rss0

    async def sample() -> None:
        nonlocal sampled
        while True:
            sampled = max(sampled, gw.rss_kib())
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        details = await attack if attack is not None else {}
        if attack is None:
            await asyncio.sleep(args.baseline)
        await wait_until_idle(gw.pid, args.drain)
        last = probe.seq
        await probe.settle(first, last, args.drain)
    finally:
        sampler.cancel()
    ended = time.monotonic()
    peak = max(sampled, gw.peak_kib() if peak_reset else 0)
    cpu = proc.cpu_seconds(gw.pid) - cpu0
    log1 = gw.log_size()
    with open(gw.log, "rb") as log:
        log.seek(log0)
        written = log.read(log1 - log0)
    lines = written.splitlines()
    stats = probe.window(first, last, started, ended)
    await asyncio.sleep(args.pause)  # quiet: what the gateway still holds afterwards
    return Row(
        name=name,
        probe=stats,
        rss_mb=(peak - rss0) / 1024,
        kept_mb=(gw.rss_kib() - rss0) / 1024,
        log_bytes=log1 - log0,
        log_lines=len(lines),
        longest_line=max((len(line) for line in lines), default=0),
        cpu=cpu,
        seconds=ended - started,
        details=details,
    )


def ms(value: float) -> str:
    return "-" if value != value else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def human_bytes(count: int) -> str:
    if count >= MB:
        return f"{count / MB:.1f} MB"
    if count >= 1024:
        return f"{count / 1024:.0f} KB"
    return f"{count} B"


def print_rows(rows: Sequence[Row]) -> None:
    headers = [
        "window",
        "s",
        "msgs",
        "p50 ms",
        "p99 ms",
        "worst ms",
        "gap ms",
        "stall ms",
        "lost",
        "refused",
        "disc.",
        "RSS +MB",
        "kept MB",
        "log",
        "log lines",
        "CPU s",
        "targets",
    ]
    table = [
        [
            r.name,
            f"{r.seconds:.1f}",
            r.probe["messages"],
            ms(r.probe["p50"]),
            ms(r.probe["p99"]),
            ms(r.probe["worst"]),
            ms(r.probe["gap"]),
            ms(r.probe["stall"]),
            r.probe["lost"],
            r.probe["refused"],
            r.probe["disconnects"],
            f"{r.rss_mb:.1f}",
            f"{r.kept_mb:.1f}",
            human_bytes(r.log_bytes),
            r.log_lines,
            f"{r.cpu:.2f}",
            "met" if not r.misses() else "missed: " + ", ".join(r.misses()),
        ]
        for r in rows
    ]
    print(stats.table(headers, table))


def print_progress(row: Row) -> None:
    p = row.probe
    print(
        f"- {row.name}: stall {ms(p['stall'])} ms (worst latency {ms(p['worst'])}, p99 "
        f"{ms(p['p99'])}), lost {p['lost']}, RSS +{row.rss_mb:.1f} MB (kept {row.kept_mb:.1f}), "
        f"log {human_bytes(row.log_bytes)} in {row.log_lines} lines (longest "
        f"{human_bytes(row.longest_line)}), CPU {row.cpu:.2f} s",
        flush=True,
    )
    if row.details:
        print(f"  attacker: {json.dumps(row.details)}", flush=True)
