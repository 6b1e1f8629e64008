"""A listener data set of any size for the criteria job: users, roles, memberships (the
library behind ``bench/criteria_data.py``, which the tests import as ``criteria_data``).

``users`` (id, plan, country, active, updated_at), ``roles`` (id, name: 8 roles) and
``memberships`` (user_id, role_id, blog_id: 1 to 5 rows per user, 2.6 on average), the same rows
in PostgreSQL (``COPY``) and as Parquet files (``DIR/users.parquet``...). :func:`churn` changes
a fraction of the listeners (plans changed, memberships added and removed, users deleted and
added), so that an incremental run has something to do. :data:`QUERY` is the criteria query over
these views; :func:`expected_criteria` says what it must give, listener by listener.

:func:`generate_wide` makes another shape of listeners: string ids of ~55 characters, 12
criteria per listener (long strings, numbers, booleans, NULLs, two lists), and group sizes skewed
by a Zipf law (a few groups hold most memberships), in ``accounts`` and ``group_members``;
:data:`WIDE_QUERY` and :func:`expected_wide_criteria` go with it.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute
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


WIDE_QUERY = """
SELECT a.id, a.tenant, a.region, a.locale, a.plan, a.tier, a.verified, a.beta, a.score,
       a.department, a.title, collect_set(g.group_name) AS groups,
       collect_set(g.project_id) AS projects
FROM accounts a
LEFT JOIN group_members g ON g.account_id = a.id
GROUP BY a.id, a.tenant, a.region, a.locale, a.plan, a.tier, a.verified, a.beta, a.score,
         a.department, a.title
"""
WIDE_SCALARS = (
    "tenant", "region", "locale", "plan", "tier", "verified", "beta", "score", "department", "title"
)  # fmt: skip
REGIONS = [f"{area}-{side}-{n}" for area in ("europe", "us", "asia") for side in ("west", "east")
           for n in (1, 2)]  # fmt: skip
LOCALES = ["en-US", "en-GB", "de-DE", "fr-FR", "es-ES", "pt-BR", "ja-JP", "it-IT", "nl-NL", "pl-PL"]
WIDE_PLANS = ["community", "starter", "professional", "business", "enterprise-plus"]
WORDS = ["platform", "infrastructure", "observability", "payments", "identity", "research",
         "customer", "success", "marketing", "analytics", "security", "mobile", "frontend",
         "backend", "operations", "compliance"]  # fmt: skip


@dataclass
class WideDataset:
    """Accounts with 10 scalar criteria, and their (skewed) group memberships."""

    accounts: pa.Table
    group_members: pa.Table

    def tables(self) -> dict[str, pa.Table]:
        return {"accounts": self.accounts, "group_members": self.group_members}


def generate_wide(listeners: int, seed: int = 1) -> WideDataset:
    """``listeners`` accounts of the wide shape, the same for the same seed."""
    rng = np.random.default_rng(seed)
    tenants = max(20, listeners // 500)
    tenant = (rng.zipf(1.5, listeners) - 1) % tenants  # a few large tenants, a long tail
    words = np.array(WORDS, dtype=object)
    tenant_names = [f"tenant-{words[n % 16]}-{words[n * 7 % 16]}-{n:05d}" for n in range(tenants)]
    serial = rng.integers(0, 1 << 62, listeners)
    ids = [f"acct:{tenant_names[t][7:]}:{s:016x}" for t, s in zip(tenant, serial, strict=True)]
    departments = [f"{a}-{b}-{c}-division" for a, b, c in rng.choice(words, (40, 3))]
    titles = [f"{lvl}-{a}-{b}-engineer" for lvl in ("senior", "staff", "principal", "associate")
              for a, b in rng.choice(words, (15, 2))]  # fmt: skip

    def pick(values: list[str], null: float = 0.0) -> pa.Array:
        chosen = np.array(values, dtype=object)[rng.integers(0, len(values), listeners)]
        chosen[rng.random(listeners) < null] = None
        return pa.array(chosen, pa.string())

    beta = pa.array(np.where(rng.random(listeners) < 0.05, True, False))
    unknown = pa.array(rng.random(listeners) < 0.2)  # beta unknown: NULL
    accounts = pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "tenant": pa.array(np.array(tenant_names, dtype=object)[tenant], pa.string()),
            "region": pick(REGIONS),
            "locale": pick(LOCALES, null=0.1),
            "plan": pick(WIDE_PLANS),
            "tier": pa.array(rng.integers(1, 6, listeners).astype(np.int32)),
            "verified": pa.array(rng.random(listeners) < 0.85),
            "beta": pa.compute.if_else(unknown, pa.scalar(None, pa.bool_()), beta),
            "score": pa.array(rng.integers(0, 100_000, listeners) / 100.0),
            "department": pick(departments, null=0.05),
            "title": pick(titles),
        }
    )
    groups = max(50, listeners // 50)
    per_account = np.minimum(rng.geometric(0.45, listeners), 5)
    member = np.repeat(np.arange(listeners), per_account)
    group = (rng.zipf(1.3, len(member)) - 1) % groups  # group 0 holds a quarter, most a few
    names = [f"g{g:06d}-{words[g % 16]}-{words[g * 5 % 16]}-team" for g in range(groups)]
    group_members = pa.table(
        {
            "account_id": pa.array(ids, pa.string()).take(pa.array(member)),
            "group_name": pa.array(names, pa.string()).take(pa.array(group)),
            "project_id": pa.array(rng.integers(1, 10 * groups, len(member)).astype(np.int32)),
        }
    )
    return WideDataset(accounts, group_members)


def expected_wide_criteria(dataset: WideDataset) -> dict[str, dict[str, Any]]:
    """What :data:`WIDE_QUERY` must give each account, as the gateway reads it back."""
    criteria: dict[str, dict[str, Any]] = {}
    for row in dataset.accounts.to_pylist():
        criteria[row["id"]] = {k: row[k] for k in WIDE_SCALARS if row[k] is not None}
    groups: dict[str, set[str]] = {}
    projects: dict[str, set[int]] = {}
    m = dataset.group_members
    columns = (m.column(c).to_pylist() for c in ("account_id", "group_name", "project_id"))
    for account, group, project in zip(*columns, strict=True):
        groups.setdefault(account, set()).add(group)
        projects.setdefault(account, set()).add(project)
    for account, entry in criteria.items():
        if account in groups:
            entry["groups"] = sorted(groups[account])
            entry["projects"] = sorted(projects[account])
    return criteria


def write_parquet(dataset: Dataset | WideDataset, folder: str | Path) -> None:
    """``folder/{table}.parquet`` for each table (``users.parquet``...; replaced)."""
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
