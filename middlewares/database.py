"""Criteria looked up in PostgreSQL when a socket authenticates (Bow's first example), with asyncpg.

The query takes the listener id as ``$1`` and returns the listener's rows; each column becomes a
criterion. Several rows (one per membership, say) merge: a column with several distinct values
becomes a list. No row is a refusal: the socket gets an ``alert``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

import asyncpg


class DatabaseCriteria:
    """``create_criteria_from_listener_details`` backed by one SQL query and a connection pool."""

    def __init__(
        self,
        *,
        query: str,
        dsn: str | None = None,
        dsn_env: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
        id_type: str = "auto",
    ) -> None:
        if dsn is None and dsn_env is not None:
            dsn = os.environ.get(dsn_env)
            if not dsn:
                raise ValueError(f"the environment variable {dsn_env} (dsn) is not set")
        if id_type not in {"auto", "int", "str"}:
            raise ValueError("id_type must be 'auto', 'int' or 'str'")
        self._query = query
        self._dsn = dsn
        self._min_size = min_size
        self._max_size = max_size
        self._id_type = id_type
        self._pool: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, details: Mapping[str, Any]) -> dict[str, Any]:
        pool = await self._get_pool()
        rows = await pool.fetch(self._query, self._listener_id(details["id"]))
        if not rows:
            raise LookupError(f"no listener {details['id']!r} in the database")
        return merge_rows([dict(row) for row in rows])

    async def aclose(self) -> None:
        """Close the pool (``Bow.stop()`` calls this)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def _listener_id(self, listener_id: Any) -> Any:
        if self._id_type == "str":
            return str(listener_id)
        if self._id_type == "int" or (isinstance(listener_id, str) and listener_id.isdigit()):
            return int(listener_id)
        return listener_id

    async def _get_pool(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._pool is None or self._loop is not loop:
            self._pool = await asyncpg.create_pool(
                self._dsn, min_size=self._min_size, max_size=self._max_size
            )
            self._loop = loop
        return self._pool

    def __repr__(self) -> str:  # never shows the DSN, which may hold a password
        return "DatabaseCriteria()"


def merge_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Columns to criteria; NULLs dropped, several distinct values in a column become a list."""
    merged: dict[str, list[Any]] = {}
    for row in rows:
        for column, value in row.items():
            values = merged.setdefault(column, [])
            for item in value if isinstance(value, list) else [value]:
                if item is not None and not any(_same(item, seen) for seen in values):
                    values.append(item)
    return {
        column: values[0] if len(values) == 1 else values
        for column, values in merged.items()
        if values
    }


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b
