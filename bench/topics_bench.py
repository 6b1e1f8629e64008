"""What topic filters add to resolving an audience, in process (no sockets, no I/O).

A ``CriteriaIndex`` of ``--sockets`` sockets (one listener each), 10% of them in a group the
audience names; then, for each scenario, the median time of ``resolve()`` alone and of
``resolve()`` followed by what delivery does with filters (``TopicIndex.narrow``, skipped while
no socket holds a filter):

- none: no socket holds a filter (Bow's case: the check costs one dict truthiness test);
- 10% other: a tenth of the sockets outside the group hold 5 filters each, and a tenth of the
  group one, none matching the name;
- 10% matching: the same, one filter of each socket matching;
- all matching: every socket holds ``quotes/#``.

    .venv/bin/python bench/topics_bench.py
    .venv/bin/python bench/topics_bench.py --sockets 100000
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from bow_gateway.core.index import CriteriaIndex
from bow_gateway.core.topic_index import TopicIndex


class Socket:
    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


def median_us(call: Callable[[], object], seconds: float) -> float:
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples) < 15:
        started = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - started) / 1_000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sockets", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    args = parser.parse_args()
    sockets = [Socket(n) for n in range(args.sockets)]
    index: CriteriaIndex[Socket] = CriteriaIndex()
    for socket in sockets:
        index.add(socket, f"user-{socket.n}", {"group": socket.n % 10 == 0, "__id": socket.n})
    audience = [{"group": True}]
    name = "quotes/forex/EURUSD"
    resolved = len(index.resolve(audience))

    def scenario(label: str, fill: Callable[[TopicIndex[Socket]], None]) -> None:
        topics: TopicIndex[Socket] = TopicIndex()
        fill(topics)

        def deliver() -> set[Socket]:
            connections = index.resolve(audience)
            if topics.holders:
                connections = topics.narrow(connections, name)
            return connections

        kept = len(deliver())
        alone = median_us(lambda: index.resolve(audience), args.seconds)
        narrowed = median_us(deliver, args.seconds)
        print(
            f"{label:<14} {len(topics.holders):>8,} {kept:>8,} {alone:>12,.1f} {narrowed:>12,.1f}"
            f" {narrowed - alone:>+10,.1f}"
        )

    def tenth(matching: bool) -> Callable[[TopicIndex[Socket]], None]:
        def fill(topics: TopicIndex[Socket]) -> None:
            for socket in sockets[3::10]:  # 10% of all, outside the group (n % 10 == 0)
                for k in range(4):
                    topics.add(socket, f"news/{socket.n % 50}/{k}/#")
                topics.add(socket, "quotes/#" if matching else f"quotes/{socket.n}")
            for socket in sockets[::100]:  # and a tenth of the group itself
                topics.add(socket, "quotes/+/EURUSD" if matching else "weather/+")

        return fill

    def everyone(topics: TopicIndex[Socket]) -> None:
        for socket in sockets:
            topics.add(socket, "quotes/#")

    print(f"{args.sockets:,} sockets, the audience resolves {resolved:,}; name {name!r}; µs")
    print(
        f"{'filters':<14} {'holders':>8} {'kept':>8} {'resolve':>12} {'+ narrow':>12} {'cost':>10}"
    )
    scenario("none", lambda topics: None)
    scenario("10% other", tenth(False))
    scenario("10% matching", tenth(True))
    scenario("all matching", everyone)


if __name__ == "__main__":
    main()
