"""The database middleware against the real PostgreSQL (database ``test`` on 127.0.0.1:5432, or
``$BOW_TEST_POSTGRES``): one query per listener, rows merged into criteria, unknown ids refused,
the pool closed by ``Bow.stop()``; and a gateway that uses it, end to end."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest
from bow_gateway.middlewares.database import DatabaseCriteria

from bow_gateway import Bow

from .support import Gateway, standard_bow, token

DSN = os.environ.get("BOW_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    """A schema of its own (the database is shared) with ``members`` (text ids: one row per
    membership) and ``accounts`` (integer ids); dropped at the end."""
    name = f"bow_test_{uuid.uuid4().hex[:12]}"
    connection = await asyncpg.connect(DSN)
    try:
        await connection.execute(
            f"""
            CREATE SCHEMA {name};
            CREATE TABLE {name}.members (id text, role text, blog_id int, premium boolean);
            INSERT INTO {name}.members VALUES
                ('USER/1', 'admin', NULL, true),
                ('USER/2', 'author', 42, false),
                ('USER/2', 'author', 418, false),
                ('USER/3', 'reader', NULL, NULL);
            CREATE TABLE {name}.accounts (id int, plan text);
            INSERT INTO {name}.accounts VALUES (42, 'gold');
            """
        )
        yield name
    finally:
        await connection.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        await connection.close()


@pytest.fixture
async def middleware(schema: str) -> AsyncIterator[DatabaseCriteria]:
    made = DatabaseCriteria(
        query=f'SELECT role, blog_id AS "blogId", premium FROM {schema}.members WHERE id = $1',
        dsn=DSN,
    )
    yield made
    await made.aclose()


async def test_one_row_gives_its_columns_as_criteria(middleware: DatabaseCriteria) -> None:
    assert await middleware({"id": "USER/1"}) == {"role": "admin", "premium": True}


async def test_several_rows_merge_a_column_s_distinct_values_into_a_list(
    middleware: DatabaseCriteria,
) -> None:
    assert await middleware({"id": "USER/2"}) == {
        "role": "author",
        "blogId": [42, 418],
        "premium": False,
    }


async def test_null_columns_are_left_out(middleware: DatabaseCriteria) -> None:
    assert await middleware({"id": "USER/3"}) == {"role": "reader"}


async def test_an_unknown_listener_is_a_lookup_error_naming_it(
    middleware: DatabaseCriteria,
) -> None:
    with pytest.raises(LookupError, match=r"no listener 'USER/9' in the database"):
        await middleware({"id": "USER/9"})


async def test_a_numeric_id_given_as_a_string_is_looked_up_as_a_number(schema: str) -> None:
    numbers = DatabaseCriteria(query=f"SELECT plan FROM {schema}.accounts WHERE id = $1", dsn=DSN)
    try:
        assert await numbers({"id": "42"}) == {"plan": "gold"}
        assert await numbers({"id": 42}) == {"plan": "gold"}
    finally:
        await numbers.aclose()


async def connections_named(application: str) -> int:
    connection = await asyncpg.connect(DSN)
    try:
        count: int = await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", application
        )
        return count
    finally:
        await connection.close()


def database_bow(criteria: DatabaseCriteria) -> Bow:
    """The quick-start gateway, with criteria from the database instead of the token."""
    return standard_bow(criteria=criteria)


async def test_a_gateway_delivers_by_database_criteria_and_refuses_unknown_listeners(
    schema: str, serve: Callable[[Bow], Awaitable[Gateway]]
) -> None:
    criteria = DatabaseCriteria(
        query=f'SELECT role, blog_id AS "blogId" FROM {schema}.members WHERE id = $1', dsn=DSN
    )
    gateway = await serve(database_bow(criteria))
    # The token's own criteria are ignored: the database says USER/2 is an author of blog 418.
    author = await gateway.listener(token("USER/2", {"role": "admin"}))
    admin = await gateway.listener(token("USER/1"))
    unknown = await gateway.connect()
    await unknown.client.emit("authenticate", (token("USER/9"),), callback=lambda *_: None)
    await unknown.wait_disconnected()
    assert unknown.alerts == ["auth_refused: no listener 'USER/9' in the database"]
    await gateway.push({"name": "post", "audience": [{"blogId": 418}]})
    await gateway.sentinel([{"role": "admin"}], admin)
    assert await author.expect("post") == {"name": "post", "audience": [{"blogId": 418}]}


async def test_stopping_the_gateway_closes_the_pool(
    schema: str, serve: Callable[[Bow], Awaitable[Gateway]]
) -> None:
    application = f"bow-test-{uuid.uuid4().hex[:8]}"
    criteria = DatabaseCriteria(
        query=f"SELECT role FROM {schema}.members WHERE id = $1",
        dsn=f"{DSN}?application_name={application}",
    )
    bow = database_bow(criteria)
    gateway = await serve(bow)
    await gateway.listener(token("USER/1"))
    assert await connections_named(application) >= 1
    await gateway.close()
    await bow.stop()  # as serve's clean-up will, again: stop() is idempotent
    assert await connections_named(application) == 0
