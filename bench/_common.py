"""Small helpers shared by the benchmark scripts (not a test module, not part of the package)."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from importlib import metadata

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile (nearest rank) of ``values``; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[rank]


def summary(values_ns: Sequence[float]) -> tuple[float, float, float, float]:
    """(median, p99, min, mean) of nanosecond samples."""
    if not values_ns:
        nan = float("nan")
        return nan, nan, nan, nan
    return (
        statistics.median(values_ns),
        percentile(values_ns, 0.99),
        min(values_ns),
        statistics.fmean(values_ns),
    )


def human_ns(ns: float) -> str:
    """A duration in ns shown as ns, µs, ms or s with three significant figures or so."""
    if ns != ns:  # NaN
        return "-"
    if ns < 1_000:
        return f"{ns:.0f} ns"
    if ns < 1_000_000:
        return f"{ns / 1_000:.1f} µs" if ns < 100_000 else f"{ns / 1_000:.0f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1_000_000:.2f} ms" if ns < 100_000_000 else f"{ns / 1_000_000:.0f} ms"
    return f"{ns / 1_000_000_000:.2f} s"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table, first column left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        )

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out.extend(line(row) for row in cells[1:])
    return "\n".join(out)


def rss_kib(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in KiB, from /proc."""
    result: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for row in status:
            if row.startswith(("VmRSS:", "VmHWM:")):
                key, value = row.split(":", 1)
                result[key] = int(value.split()[0])
    return result


def cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process (all its threads) in seconds, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        text = stat.read()
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS  # fields 14, 15 of proc(5)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process in seconds."""
    return sum(cpu_times(pid))


def machine_busy_seconds() -> float:
    """CPU seconds spent by every CPU of the machine outside idle and iowait, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def load_average() -> str:
    with open("/proc/loadavg", encoding="ascii") as loadavg:
        return " ".join(loadavg.read().split()[:3])


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for row in cpuinfo:
                if row.startswith("model name"):
                    return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment(packages: Sequence[str]) -> str:
    """One paragraph naming the date, machine, Python and library versions."""
    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return "\n".join(
        [
            f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
            f"cpu: {cpu_model()} ({os.cpu_count()} logical CPUs, usable: {affinity})",
            f"python: {sys.version.split()[0]} ({platform.python_implementation()}) on "
            f"{platform.system()} {platform.release()}",
            "libraries: " + ", ".join(versions),
            f"load average at start (1, 5, 15 min): {load_average()}",
        ]
    )


def wait_for_quiet(limit: float, seconds: int = 3, threshold: float = 0.1) -> bool:
    """Wait until the machine has been quiet (every process together under ``threshold`` of a
    CPU) for ``seconds`` seconds in a row, at most ``limit`` seconds; False if it never was."""
    started = time.monotonic()
    quiet = 0
    while time.monotonic() - started < limit:
        before = machine_busy_seconds()
        time.sleep(1)
        quiet = quiet + 1 if machine_busy_seconds() - before < threshold else 0
        if quiet >= seconds:
            return True
    print(f"  (the machine was not quiet within {limit:g} s: going on anyway)", flush=True)
    return False
