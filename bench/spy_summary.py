"""Summarise py-spy's raw collapsed stacks (``py-spy record -f raw``, ``fanout_bench.py --py-spy``).

Run:  .venv/bin/python bench/spy_summary.py /tmp/spy/10000-bow-683c8ee-flywheel-r1-sat-100.txt
      .venv/bin/python bench/spy_summary.py A.txt --against B.txt   # shares side by side

A plain script, not a test. Per file: the samples, then the functions by *self* share (the
innermost frame of a sample) and by *inclusive* share (in the stack at all, counted once per
sample), as a percentage of all the samples (the gateway is single-threaded: a share of its
samples is a share of its CPU while it was sampled). ``--against`` prints a second file's shares
in a column next to the first's (e.g. Flywheel against Socket.IO, same phase). A frame is
``function (file)``, the line number dropped so that one function is one row.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from lib import stats

LINE = re.compile(r":\d+\)$")


def load(path: Path) -> tuple[int, Counter[str], Counter[str]]:
    """(samples, self counts, inclusive counts) of one raw collapsed-stacks file."""
    total = 0
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for row in path.read_text().splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        frames = [LINE.sub(")", frame) for frame in stack.split(";")]
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    return total, own, inclusive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--against", type=Path, help="another profile, shown in a column")
    parser.add_argument("--top", type=int, default=25, help="rows per table")
    parser.add_argument("--grep", default="", help="only frames containing this text")
    args = parser.parse_args(argv)
    other = load(args.against) if args.against else None
    for path in args.files:
        total, own, inclusive = load(path)
        print(f"{path}: {total:,} samples" + (f"; against {args.against}" if other else ""))
        their_total, their_own, their_inclusive = other or (0, Counter[str](), Counter[str]())
        for title, counts, theirs in (
            ("self", own, their_own),
            ("inclusive", inclusive, their_inclusive),
        ):
            rows = []
            for frame, count in counts.most_common():
                if args.grep not in frame:
                    continue
                row = [frame, f"{100 * count / total:.1f}%"]
                if other is not None:
                    share = 100 * theirs[frame] / their_total if their_total else float("nan")
                    row.append(f"{share:.1f}%")
                rows.append(row)
                if len(rows) >= args.top:
                    break
            headers = [f"{title}: function (file)", path.name[:40]]
            if args.against:
                headers.append(args.against.name[:40])
            print(stats.table(headers, rows))
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
