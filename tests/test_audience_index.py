"""The audience index's reader against a private redis-server holding generations written in the
documented layout (the job's own run is tests/test_criteria_job_index.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio
from pyroaring import BitMap

from bow_gateway.runtime.audience_index import AudienceIndex

from .support.audience_index import Listeners, write_index
from .support.redis_server import RedisServer

NAMESPACE = "ax"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


@pytest.fixture
async def client(server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    connection = redis.asyncio.Redis.from_url(server.url)
    await connection.flushdb()
    yield connection
    await connection.aclose()


async def write(
    client: redis.asyncio.Redis, generation: str, listeners: Listeners, holes: int = 0
) -> list[Any]:
    """A generation of :data:`NAMESPACE` and its criteria snapshot, made live."""
    return await write_index(client, NAMESPACE, generation, listeners, holes)


async def ids_of(reader: AudienceIndex, audience: list[dict[str, Any]]) -> set[Any]:
    reach = await reader.matching(audience)
    assert reach is not None
    return set(await reader.listener_ids(reach.listeners, 1000))


async def test_without_an_index_the_reader_answers_none(client: redis.asyncio.Redis) -> None:
    assert await AudienceIndex(client, NAMESPACE).matching([{"role": "admin"}]) is None


async def test_true_one_and_the_string_one_are_three_values(client: redis.asyncio.Redis) -> None:
    await write(client, "g1", {"a": {"x": True}, "b": {"x": 1}, "c": {"x": "1"}, "d": {"x": 42.0}})
    reader = AudienceIndex(client, NAMESPACE)
    assert [await ids_of(reader, [{"x": v}]) for v in (True, 1, "1", 42)] == [
        {"a"},
        {"b"},
        {"c"},
        {"d"},
    ]
    assert await ids_of(reader, [{"x": 1.0}]) == {"b"}


async def test_queries_are_ored_and_predicates_anded(client: redis.asyncio.Redis) -> None:
    await write(
        client,
        "g1",
        {1: {"role": "admin", "blog": [4, 5]}, 2: {"role": "author", "blog": [5]}, 3: {}},
    )
    reader = AudienceIndex(client, NAMESPACE)
    assert await ids_of(reader, [{"role": "admin", "blog": 5}]) == {1}
    assert await ids_of(reader, [{"role": "author"}, {"blog": 4}]) == {1, 2}
    assert await ids_of(reader, [{"role": "admin", "blog": 6}]) == set()


async def test_an_id_predicate_goes_through_the_criteria_snapshot(
    client: redis.asyncio.Redis,
) -> None:
    await write(client, "g1", {"42": {"role": "admin"}, 42: {"role": "author"}, 7: {}})
    reader = AudienceIndex(client, NAMESPACE)
    assert await ids_of(reader, [{"__id": "42"}]) == {"42"}
    assert await ids_of(reader, [{"__id": 42.0, "role": "author"}]) == {42}
    assert await ids_of(reader, [{"__id": 42, "role": "admin"}]) == set()
    assert await ids_of(reader, [{"__id": 7}, {"__id": "nobody"}]) == {7}


async def test_listener_ids_keep_their_json_type_and_skip_holes(
    client: redis.asyncio.Redis,
) -> None:
    await write(client, "g1", {"1": {"k": "v"}, 1: {"k": "v"}}, holes=3)
    reader = AudienceIndex(client, NAMESPACE)
    assert await reader.listener_ids(BitMap(range(5)), 10) == ["1", 1]
    assert await reader.listener_ids(BitMap(range(5)), 1) == ["1"]


async def test_the_cache_holds_at_most_max_bitmaps(client: redis.asyncio.Redis) -> None:
    await write(client, "g1", {n: {"n": n} for n in range(10)})
    reader = AudienceIndex(client, NAMESPACE, max_bitmaps=3)
    assert await ids_of(reader, [{"n": n} for n in range(10)]) == set(range(10))
    assert len(reader._bitmaps) == 3


async def test_a_new_generation_drops_the_cached_bitmaps(client: redis.asyncio.Redis) -> None:
    await write(client, "g1", {1: {"role": "admin"}, 2: {"role": "author"}})
    reader = AudienceIndex(client, NAMESPACE, check_seconds=0)
    first = await reader.matching([{"role": "admin"}])
    await write(client, "g2", {3: {"role": "author"}, 2: {"role": "admin"}})
    second = await reader.matching([{"role": "admin"}])
    assert first is not None and second is not None
    assert (first.generation, second.generation) == ("g1", "g2")
    assert await reader.listener_ids(second.listeners, 10) == [2]


async def test_the_generation_is_read_at_most_every_check_seconds(
    client: redis.asyncio.Redis,
) -> None:
    await write(client, "g1", {1: {"role": "admin"}})
    reader = AudienceIndex(client, NAMESPACE, check_seconds=3600)
    await reader.matching([{"role": "admin"}])
    await write(client, "g2", {2: {"role": "admin"}})
    reach = await reader.matching([{"role": "admin"}])
    assert reach is not None and reach.generation == "g1"  # g1's bitmaps, g1's ids: not mixed
    assert await reader.listener_ids(reach.listeners, 10) == [1]
