"""prometheus_client's histogram and counter, updated once per event-loop step on the hot path.

Each ``Histogram.observe`` and ``Counter.inc`` takes a lock and runs a dozen Python lines: for
the two histograms and the counter a message updates, 15% of the gateway's instructions per
retained message (``bench/instructions_bench.py``). The event loop is one thread, so a step's
observations are counted here in plain integers and added to the metric when the step ends:
one locked update per bucket that moved, whatever the number of messages. Adding a count to a
histogram's bucket has no public method; this reaches into ``Histogram._upper_bounds``,
``_buckets`` and ``_sum``, as prometheus-client 0.20 to 0.26 (setup.cfg's pins) define them,
and checks that they are there.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from typing import Any

from prometheus_client import Counter, Histogram


class StepHistogram:
    """A histogram's observations of one event-loop step, added to it when the step ends."""

    def __init__(self, histogram: Histogram) -> None:
        try:
            bounds: list[float] = list(histogram._upper_bounds)
            self._buckets: list[Any] = list(histogram._buckets)
            self._sum: Any = histogram._sum
        except AttributeError as error:
            raise ImportError(
                "bow_gateway reaches into prometheus_client's Histogram (written for 0.20-0.26): "
                f"{error}; pip install 'prometheus-client>=0.20,<0.27'"
            ) from None
        if len(bounds) != len(self._buckets) or bounds[-1] != float("inf"):
            raise ImportError("prometheus_client's Histogram is not as bow_gateway expects")
        self._bounds = bounds
        self._counts = [0] * len(bounds)
        self._total = 0.0
        self._flush: asyncio.Handle | None = None

    def observe(self, amount: float) -> None:
        """As ``Histogram.observe``: in the bucket of the first bound at least ``amount``."""
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._total += amount
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Add what was observed since the last flush to the histogram."""
        self._flush = None
        counts = self._counts
        for index, count in enumerate(counts):
            if count:
                self._buckets[index].inc(count)
                counts[index] = 0
        self._sum.inc(self._total)
        self._total = 0.0


class StepCounter:
    """A counter's increments of one event-loop step, added to it when the step ends."""

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self._pending = 0
        self._flush: asyncio.Handle | None = None

    def inc(self, amount: int = 1) -> None:
        self._pending += amount
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush = None
        pending, self._pending = self._pending, 0
        if pending:
            self._counter.inc(pending)
