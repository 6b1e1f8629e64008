"""Figures and their text: quantiles, durations, percentages and plain-text tables."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


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


def percentiles(values: Sequence[float]) -> tuple[float, float]:
    """(p50, p99) of ``values``, nearest rank."""
    ordered = sorted(values)
    return percentile(ordered, 0.5), percentile(ordered, 0.99)


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


def signed_ns(ns: float) -> str:
    """A difference of durations in ns, with its sign."""
    return ("-" if ns < 0 else "+") + human_ns(abs(ns))


def pct(seconds: float, wall: float) -> str:
    """CPU seconds as a share of wall seconds (100% = one CPU busy)."""
    return f"{100 * seconds / wall:.0f}%" if wall > 0 else "-"


def median_range(values: list[float], form: str = "{:.1f}") -> str:
    """The median of ``values``, then their range in parentheses when there are several."""
    if not values:
        return "-"
    middle = form.format(statistics.median(values))
    if len(values) == 1:
        return middle
    return f"{middle} ({form.format(min(values))}-{form.format(max(values))})"


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
