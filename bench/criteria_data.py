"""A listener data set of any size for the criteria job: users, roles, memberships.

Run:  .venv/bin/python bench/criteria_data.py --listeners 1000000 [--parquet DIR] [--postgres DSN]
      [--schema bow_bench] [--seed 1] [--churn 0.01]

``users`` (id, plan, country, active, updated_at), ``roles`` (id, name: 8 roles) and
``memberships`` (user_id, role_id, blog_id: 1 to 5 rows per user, 2.6 on average), the same rows
in PostgreSQL (``COPY``, into ``--schema``) and as Parquet files (``DIR/users.parquet``...).
``--churn F`` then changes about F of the listeners (plans changed, memberships added and
removed, users deleted and added) and writes the changed data set the same way, so that an
incremental run has something to do. :data:`QUERY` is the criteria query over these views;
:func:`expected_criteria` says what it must give, listener by listener.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

ROLES = ["admin", "editor", "author", "reviewer", "subscriber", "moderator", "support", "billing"]
ROLE_WEIGHTS = [0.01, 0.04, 0.10, 0.05, 0.60, 0.05, 0.05, 0.10]
PLANS = ["free", "pro", "team", "enterprise"]
PLAN_WEIGHTS = [0.6, 0.25, 0.1, 0.05]
COUNTRIES = ["US", "DE", "FR", "GB", "IN", "BR", "JP", "ES", "IT", "NL", "SE", "PL", "CA", "MX"]

QUERY = """
SELECT u.id, u.plan, u.country, u.active,
       collect_set(r.name) AS role, collect_set(m.blog_id) AS blogId
FROM users u
LEFT JOIN memberships m ON m.user_id = u.id
LEFT JOIN roles r ON r.id = m.role_id
GROUP BY u.id, u.plan, u.country, u.active
"""

DDL = {
    "users": "id bigint PRIMARY KEY, plan text NOT NULL, country text, active boolean NOT NULL,"
    " updated_at timestamptz NOT NULL",
    "roles": "id integer PRIMARY KEY, name text NOT NULL",
    "memberships": "user_id bigint NOT NULL, role_id integer NOT NULL, blog_id integer NOT NULL",
}


@dataclass
class Dataset:
    """The three tables, as Arrow tables."""

    users: pa.Table
    roles: pa.Table
    memberships: pa.Table

    def tables(self) -> dict[str, pa.Table]:
        return {"users": self.users, "roles": self.roles, "memberships": self.memberships}


def generate(listeners: int, seed: int = 1) -> Dataset:
    """``listeners`` users (ids 1..N) with their memberships, the same for the same seed."""
    rng = np.random.default_rng(seed)
    ids = np.arange(1, listeners + 1, dtype=np.int64)
    users = _users(rng, ids)
    memberships = _memberships(rng, ids, blogs=max(10, listeners // 20))
    roles = pa.table({"id": pa.array(range(1, len(ROLES) + 1), pa.int32()), "name": ROLES})
    return Dataset(users, roles, memberships)


def _users(rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    count = len(ids)
    country = np.array(COUNTRIES, dtype=object)[rng.integers(0, len(COUNTRIES), count)]
    country[rng.random(count) < 0.05] = None  # unknown: a NULL, dropped from the criteria
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "plan": np.array(PLANS, dtype=object)[rng.choice(len(PLANS), count, p=PLAN_WEIGHTS)],
            "country": pa.array(country, pa.string()),
            "active": pa.array(rng.random(count) < 0.9),
            "updated_at": pa.array(np.full(count, int(time.time()), "datetime64[s]")).cast(
                pa.timestamp("us", tz="UTC")
            ),
        }
    )


def _memberships(rng: np.random.Generator, ids: np.ndarray, blogs: int) -> pa.Table:
    per_user = np.clip(rng.poisson(1.6, len(ids)) + 1, 1, 5)
    user_id = np.repeat(ids, per_user)
    return pa.table(
        {
            "user_id": pa.array(user_id, pa.int64()),
            "role_id": pa.array(
                rng.choice(len(ROLES), len(user_id), p=ROLE_WEIGHTS) + 1, pa.int32()
            ),
            "blog_id": pa.array(rng.integers(1, blogs + 1, len(user_id)), pa.int32()),
        }
    )


def churn(dataset: Dataset, fraction: float, seed: int = 2) -> tuple[Dataset, int]:
    """About ``fraction`` of the listeners changed; returns the new data set and that count.

    Of the touched listeners: 40% change plan, 20% gain a membership, 20% lose all of theirs,
    10% are deleted and 10% are new users.
    """
    rng = np.random.default_rng(seed)
    users, memberships = dataset.users, dataset.memberships
    ids = users.column("id").to_numpy()
    touched = max(10, int(len(ids) * fraction))
    picked = rng.choice(ids, size=min(len(ids), touched), replace=False)
    share = np.split(picked, [int(touched * 0.4), int(touched * 0.6), int(touched * 0.8)])
    replan, gain, lose, delete = share[0], share[1], share[2], share[3][: max(1, touched // 10)]
    plan = users.column("plan").to_numpy(zero_copy_only=False).copy()
    where = np.isin(ids, replan)
    plan[where] = np.where(plan[where] == "free", "pro", "free")
    users = users.set_column(users.schema.get_field_index("plan"), "plan", pa.array(plan))
    keep = ~np.isin(memberships.column("user_id").to_numpy(), np.concatenate([lose, delete]))
    memberships = memberships.filter(pa.array(keep))
    users = users.filter(pa.array(~np.isin(ids, delete)))
    next_id = int(ids.max()) + 1
    added = np.arange(next_id, next_id + max(1, touched // 10), dtype=np.int64)
    users = pa.concat_tables([users, _users(rng, added)])
    blogs = max(10, len(ids) // 20)
    extra = pa.table(
        {
            "user_id": pa.array(np.concatenate([gain, added]), pa.int64()),
            "role_id": pa.array(np.full(len(gain) + len(added), 1, np.int32)),  # admin: rare, new
            "blog_id": pa.array(rng.integers(1, blogs + 1, len(gain) + len(added)), pa.int32()),
        }
    )
    memberships = pa.concat_tables([memberships, extra])
    return Dataset(users, dataset.roles, memberships), len(replan) + len(gain) + len(lose) + len(
        delete
    ) + len(added)


def expected_criteria(dataset: Dataset) -> dict[int, dict[str, Any]]:
    """What :data:`QUERY` must give each listener, as the gateway reads it back."""
    names = dict(zip(dataset.roles.column("id").to_pylist(), ROLES, strict=True))
    criteria: dict[int, dict[str, Any]] = {}
    for row in dataset.users.select(["id", "plan", "country", "active"]).to_pylist():
        entry = {"plan": row["plan"], "country": row["country"], "active": row["active"]}
        criteria[row["id"]] = {k: v for k, v in entry.items() if v is not None}
    roles: dict[int, set[str]] = {}
    blogs: dict[int, set[int]] = {}
    m = dataset.memberships
    for user, role, blog in zip(*(m.column(c).to_pylist() for c in m.column_names), strict=True):
        if user in criteria:
            roles.setdefault(user, set()).add(names[role])
            blogs.setdefault(user, set()).add(blog)
    for user, entry in criteria.items():
        if user in roles:
            entry["role"] = sorted(roles[user])
            entry["blogId"] = sorted(blogs[user])
    return criteria


def write_parquet(dataset: Dataset, folder: str | Path) -> None:
    """``folder/users.parquet``, ``roles.parquet``, ``memberships.parquet`` (replaced)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    for name, table in dataset.tables().items():
        pq.write_table(table, Path(folder) / f"{name}.parquet", row_group_size=256 * 1024)


async def write_postgres(dataset: Dataset, dsn: str, schema: str = "bow_bench") -> None:
    """The three tables in ``schema`` (dropped and re-created), loaded with ``COPY``."""
    import asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        for name, table in dataset.tables().items():
            await connection.execute(f'DROP TABLE IF EXISTS "{schema}"."{name}"')
            await connection.execute(f'CREATE UNLOGGED TABLE "{schema}"."{name}" ({DDL[name]})')
            buffer = io.BytesIO()
            pa_csv.write_csv(table, buffer, pa_csv.WriteOptions(include_header=False))
            buffer.seek(0)
            await connection.copy_to_table(
                name, source=buffer, schema_name=schema, format="csv", columns=table.column_names
            )
        await connection.execute(f'CREATE INDEX ON "{schema}"."memberships" (user_id)')
        await connection.execute(f'ANALYZE "{schema}".users, "{schema}".memberships')
    finally:
        await connection.close()


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
    args = parser.parse_args()
    started = time.perf_counter()
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
