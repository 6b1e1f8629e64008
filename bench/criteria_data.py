"""A listener data set of any size for the criteria job: users, roles, memberships.

Run:  .venv/bin/python bench/criteria_data.py --listeners 1000000 [--parquet DIR] [--postgres DSN]
      [--schema bow_bench] [--seed 1] [--churn 0.01] [--shape standard|wide]

``users`` (id, plan, country, active, updated_at), ``roles`` (id, name: 8 roles) and
``memberships`` (user_id, role_id, blog_id: 1 to 5 rows per user, 2.6 on average), the same rows
in PostgreSQL (``COPY``, into ``--schema``) and as Parquet files (``DIR/users.parquet``...).
``--churn F`` then changes about F of the listeners (plans changed, memberships added and
removed, users deleted and added) and writes the changed data set the same way, so that an
incremental run has something to do. :data:`QUERY` is the criteria query over these views;
:func:`expected_criteria` says what it must give, listener by listener.

``--shape wide`` makes another shape of listeners instead (:func:`generate_wide`): string ids of
~55 characters, 12 criteria per listener (long strings, numbers, booleans, NULLs, two lists), and
group sizes skewed by a Zipf law (a few groups hold most memberships), in ``accounts`` and
``group_members``; :data:`WIDE_QUERY` and :func:`expected_wide_criteria` go with it.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterable

from lib.criteria_data import (
    DDL,
    QUERY,
    WIDE_QUERY,
    Dataset,
    WideDataset,
    churn,
    expected_criteria,
    expected_wide_criteria,
    generate,
    generate_wide,
    write_parquet,
    write_postgres,
)

__all__ = [  # what the tests import (pytest's pythonpath holds bench/)
    "DDL",
    "QUERY",
    "WIDE_QUERY",
    "Dataset",
    "WideDataset",
    "churn",
    "expected_criteria",
    "expected_wide_criteria",
    "generate",
    "generate_wide",
    "write_parquet",
    "write_postgres",
]


def _print(lines: Iterable[str]) -> None:
    for line in lines:
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--listeners", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parquet", metavar="DIR", help="write Parquet files into DIR")
    parser.add_argument("--postgres", metavar="DSN", help="load into PostgreSQL at DSN")
    parser.add_argument("--schema", default="bow_bench", help="PostgreSQL schema (bow_bench)")
    parser.add_argument("--churn", type=float, default=0.0, help="then change this fraction")
    parser.add_argument("--shape", choices=("standard", "wide"), default="standard")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.shape == "wide":
        wide = generate_wide(args.listeners, args.seed)
        if args.parquet:
            write_parquet(wide, args.parquet)
        print(
            f"{wide.accounts.num_rows:,} accounts, {wide.group_members.num_rows:,} group"
            f" memberships in {time.perf_counter() - started:.1f} s (Parquet only)"
        )
        return
    dataset = generate(args.listeners, args.seed)
    changed = 0
    if args.churn:
        dataset, changed = churn(dataset, args.churn)
    if args.parquet:
        write_parquet(dataset, args.parquet)
    if args.postgres:
        asyncio.run(write_postgres(dataset, args.postgres, args.schema))
    _print(
        [
            f"{dataset.users.num_rows:,} users, {dataset.memberships.num_rows:,} memberships"
            + (f", {changed:,} listeners changed" if args.churn else "")
            + f" in {time.perf_counter() - started:.1f} s",
        ]
    )


if __name__ == "__main__":
    main()
