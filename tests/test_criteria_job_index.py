"""The criteria job's audience index, for real: local Spark, a private redis-server, and the
gateway's reader checked against a brute-force evaluation of random audiences over the input."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow
import pyarrow.parquet
import pytest
import redis
from pyspark.sql import SparkSession

from bow_gateway.core.audience_layout import CHUNK, IndexLayout, IndexPointer
from bow_gateway.core.index import entries_of, matches
from bow_gateway.job.config import ConfigError, parse_job_config
from bow_gateway.job.run import run_job
from bow_gateway.job.spark import build_session
from bow_gateway.runtime.audience_index import AudienceIndex

from .support import AUTH, base_config, standard_bow
from .support.redis_server import RedisServer
from .support.webhooks import Receiver, webhook_table

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

LISTENERS = 3000
JAR = "/usr/share/java/postgresql.jar"
ROLES = ["admin", "author", "reader", "1", "true", "42"]
SCHEMA = pyarrow.schema(
    [
        ("id", pyarrow.string()),
        ("role", pyarrow.string()),
        ("level", pyarrow.int64()),
        ("score", pyarrow.float64()),
        ("active", pyarrow.bool_()),
        ("tags", pyarrow.list_(pyarrow.string())),
        ("blogs", pyarrow.list_(pyarrow.int64())),
    ]
)
Row = dict[str, Any]


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(config={"hash-max-listpack-value": 512}) as started:
        yield started


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "3"}
    settings = document("redis://unused", "x", Path("."), conf)
    if os.path.isfile(JAR):  # the JVM outlives the session: later modules' JDBC inputs need it
        jdbc = {"name": "t", "format": "jdbc", "url": "jdbc:postgresql://x/y", "table": "t"}
        settings["inputs"].append({**jdbc, "jar": JAR})
    session = build_session(parse_job_config(settings))
    yield session
    session.stop()


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    return f"i{zlib.crc32(request.node.name.encode())}"


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(server.url)
    yield connection
    connection.close()


def document(
    url: str, namespace: str, folder: Path, conf: dict[str, str] | None = None, **index: Any
) -> dict[str, Any]:
    return {
        "redis": {"url": url, "namespace": namespace},
        "inputs": [{"name": "people", "format": "parquet", "path": str(folder / "people")}],
        "criteria": {"query": "SELECT * FROM people"},
        "snapshot": {
            "lock_seconds": 10,
            "grace_seconds": 30,
            "state_dir": str(folder / "state"),
        },
        **({"index": index} if index else {}),
        **({"spark": {"conf": conf}} if conf else {}),
    }


def person(rng: random.Random, number: int) -> Row:
    maybe = rng.random
    return {
        "id": f"USER/{number}" if number % 7 else str(number),  # some ids look like numbers
        "role": rng.choice(ROLES) if maybe() < 0.9 else None,
        "level": rng.randrange(4) if maybe() < 0.8 else None,
        "score": rng.choice([1.0, 2.0, 2.5, 42.0, -0.5]) if maybe() < 0.7 else None,
        "active": rng.random() < 0.5 if maybe() < 0.9 else None,
        "tags": rng.sample(["1", "42", "true", "red", "blue"], rng.randrange(4)),
        "blogs": [rng.randrange(30) for _ in range(rng.randrange(5))],
    }


def save(rows: list[Row], folder: Path) -> None:
    target = folder / "people"
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("*.parquet"):
        old.unlink()
    for part in range(3):  # several files: several partitions
        table = pyarrow.Table.from_pylist(rows[part::3], schema=SCHEMA)
        pyarrow.parquet.write_table(table, target / f"p{part}.parquet")


def criteria_of(row: Row) -> dict[str, Any]:
    """The criteria the job stores for a row: no NULLs, lists without duplicates, no empty list."""
    found: dict[str, Any] = {}
    for key, value in row.items():
        if key == "id" or value is None:
            continue
        if isinstance(value, list):
            value = sorted(set(value))
            if not value:
                continue
        found[key] = value
    return found


def random_audience(rng: random.Random, rows: list[Row]) -> list[dict[str, Any]]:
    """1-3 queries of every shape: ``__id`` (with or without more), one predicate, several."""
    values: dict[str, list[Any]] = {
        "role": [*ROLES, 1, 42, True],
        "level": [0, 1, 2.0, 3, "1", True],
        "score": [1, 2, 2.5, 42, 42.0, -0.5, "42"],
        "active": [True, False, 1, 0, "true"],
        "tags": ["1", "42", "true", "red", 1, 42, True],
        "blogs": [0, 1, 5, 7.0, "5", 29],
    }
    audience = []
    for _ in range(rng.randrange(1, 4)):
        keys = rng.sample(sorted(values), rng.randrange(1, 4))
        query = {key: rng.choice(values[key]) for key in keys}
        if rng.random() < 0.25:
            query = dict(rng.sample(sorted(query.items()), rng.randrange(len(query))))
            query["__id"] = rng.choice(rows)["id"] if rng.random() < 0.9 else "USER/none"
        audience.append(query)
    return audience


def brute_force(rows: list[Row], audience: list[dict[str, Any]]) -> set[Any]:
    return {row["id"] for row in rows if matches(entries_of(criteria_of(row)), row["id"], audience)}


def run(url: str, namespace: str, folder: Path, spark: SparkSession, **kwargs: Any) -> Any:
    config = parse_job_config(document(url, namespace, folder))
    return run_job(config, spark, **kwargs)


async def check(url: str, namespace: str, rows: list[Row], seed: int, audiences: int) -> None:
    """The reader's counts and ids equal the brute force's, for many random audiences."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        reader = AudienceIndex(client, namespace, max_bitmaps=16, check_seconds=0)
        rng = random.Random(seed)
        reached = 0
        for _ in range(audiences):
            audience = random_audience(rng, rows)
            reach = await reader.matching(audience)
            assert reach is not None
            expected = brute_force(rows, audience)
            ids = await reader.listener_ids(reach.listeners, len(reach) + 1)
            assert (len(reach), set(ids)) == (len(expected), expected), audience
            reached += bool(expected)
        assert reached > audiences // 3  # the audiences are not all empty ones
    finally:
        await client.aclose()


def numbers(client: redis.Redis, namespace: str) -> dict[str, int]:
    """Each listener's number in the live generation (its id field -> number)."""
    layout = IndexLayout(namespace)
    pointer = IndexPointer.from_json(client.get(layout.pointer_key))
    assert pointer is not None
    found = {}
    for chunk in range(pointer.chunks):
        raw = client.get(layout.ids_key(pointer.generation, chunk)) or b""
        text = raw.decode() if isinstance(raw, bytes) else raw
        for offset, field in enumerate(text.split("\n")):
            if field:
                found[field] = chunk * CHUNK + offset
    return found


def test_full_run_index_answers_as_brute_force(
    spark: SparkSession, server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    rng = random.Random(1)
    rows = [person(rng, n) for n in range(LISTENERS)]
    save(rows, tmp_path)
    run(server.url, namespace, tmp_path, spark)
    asyncio.run(check(server.url, namespace, rows, seed=2, audiences=300))


def test_incremental_run_keeps_numbers_and_answers_as_brute_force(
    spark: SparkSession, server: RedisServer, client: redis.Redis, namespace: str, tmp_path: Path
) -> None:
    rng = random.Random(3)
    rows = [person(rng, n) for n in range(LISTENERS)]
    save(rows, tmp_path)
    run(server.url, namespace, tmp_path, spark)
    before = numbers(client, namespace)
    assert sorted(before.values()) == list(range(LISTENERS))
    changed = [person(rng, n) if n % 10 == 0 else row for n, row in enumerate(rows)]
    kept = [row for n, row in enumerate(changed) if n % 13]  # some removed
    later = kept + [person(rng, n) for n in range(LISTENERS, LISTENERS + 200)]  # some added
    save(later, tmp_path)
    layout = IndexLayout(namespace)
    first = IndexPointer.from_json(client.get(layout.pointer_key))
    assert first is not None and first.state is not None  # what the next run updates
    client.config_resetstat()
    summary = run(server.url, namespace, tmp_path, spark, incremental=True)
    assert summary.mode == "incremental"
    commands = client.info("commandstats")
    assert commands["cmdstat_restore"]["calls"] > 0  # the live generation's, then changes applied
    second = IndexPointer.from_json(client.get(layout.pointer_key))
    assert second is not None and second.generation != first.generation
    assert (second.listeners, second.next) == (len(later), LISTENERS + 200)
    after = numbers(client, namespace)
    assert {f: n for f, n in after.items() if f in before} == {
        f: n for f, n in before.items() if f in after
    }
    assert sorted(n for f, n in after.items() if f not in before) == list(
        range(LISTENERS, LISTENERS + 200)
    )
    asyncio.run(check(server.url, namespace, later, seed=4, audiences=300))


def test_reader_never_mixes_generations_across_a_swap(
    spark: SparkSession, server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    rng = random.Random(5)
    first = [person(rng, n) for n in range(500)]
    second = [person(rng, n) for n in range(500)]
    audience: list[dict[str, Any]] = [{"role": "admin"}, {"tags": "42", "active": True}]

    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            reader = AudienceIndex(client, namespace, check_seconds=0)
            reach = await reader.matching(audience)
            assert reach is not None
            assert set(await reader.listener_ids(reach.listeners, 10_000)) == brute_force(
                first, audience
            )
            save(second, tmp_path)
            await asyncio.to_thread(run, server.url, namespace, tmp_path, spark)
            later = await reader.matching(audience)
            assert later is not None and later.generation != reach.generation
            ids = set(await reader.listener_ids(later.listeners, 10_000))
            assert (len(later), ids) == (
                len(brute_force(second, audience)),
                brute_force(second, audience),
            )
        finally:
            await client.aclose()

    save(first, tmp_path)
    run(server.url, namespace, tmp_path, spark)
    asyncio.run(scenario())


def test_turning_the_index_off_removes_its_pointer(
    spark: SparkSession, server: RedisServer, client: redis.Redis, namespace: str, tmp_path: Path
) -> None:
    rng = random.Random(6)
    save([person(rng, n) for n in range(100)], tmp_path)
    run(server.url, namespace, tmp_path, spark)
    assert client.exists(IndexLayout(namespace).pointer_key)
    config = parse_job_config(document(server.url, namespace, tmp_path, enabled=False))
    run_job(config, spark)
    assert not client.exists(IndexLayout(namespace).pointer_key)


def test_incremental_run_without_its_index_state_reads_the_numbers_back(
    spark: SparkSession, server: RedisServer, client: redis.Redis, namespace: str, tmp_path: Path
) -> None:
    rng = random.Random(7)
    rows = [person(rng, n) for n in range(400)]
    save(rows, tmp_path)
    run(server.url, namespace, tmp_path, spark)
    before = numbers(client, namespace)
    pointer = IndexPointer.from_json(client.get(IndexLayout(namespace).pointer_key))
    assert pointer is not None and pointer.state is not None
    shutil.rmtree(pointer.state)  # lost: the numbers come from the ids chunks
    later = rows[50:] + [person(rng, n) for n in range(400, 420)]
    save(later, tmp_path)
    run(server.url, namespace, tmp_path, spark, incremental=True)
    after = numbers(client, namespace)
    assert {f: after[f] for f in before if f in after} == {
        f: before[f] for f in after if f in before
    }
    assert sorted(n for f, n in after.items() if f not in before) == list(range(400, 420))
    asyncio.run(check(server.url, namespace, later, seed=8, audiences=100))


def test_the_index_setting_is_checked(tmp_path: Path) -> None:
    assert parse_job_config(document("redis://x", "n", tmp_path)).index_enabled is True
    off = parse_job_config(document("redis://x", "n", tmp_path, enabled=False))
    assert off.index_enabled is False
    with pytest.raises(ConfigError, match=r"index\.enabled: must be true or false"):
        parse_job_config(document("redis://x", "n", tmp_path, enabled="yes"))
    with pytest.raises(ConfigError, match=r"index\.bitmaps: unknown setting"):
        parse_job_config(document("redis://x", "n", tmp_path, bitmaps=1))


def test_the_gateway_answers_reach_and_fallbacks_as_brute_force(
    spark: SparkSession, server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """``POST /_bow/reach`` of a gateway on the job's namespace counts what the brute force
    counts, for audiences of every shape; a ``Bow-Fallback`` message nobody is connected for
    names every listener the brute force finds, in ``message.undelivered``."""
    rng = random.Random(5)
    rows = [person(rng, n) for n in range(LISTENERS)]
    save(rows, tmp_path)
    run(server.url, namespace, tmp_path, spark)
    asyncio.run(gateway_checks(server.url, namespace, rows))


async def gateway_checks(url: str, namespace: str, rows: list[Row]) -> None:
    receiver = await Receiver().start()
    config = base_config(
        redis=url,
        namespace=namespace,
        api={"max_counts_per_second": 1_000},
        webhooks=[webhook_table(receiver.url)],
    )
    bow = standard_bow(config)
    await bow.start()
    try:
        rng = random.Random(6)
        async with aiohttp.ClientSession() as http:
            endpoint = f"http://127.0.0.1:{bow.port}/_bow/reach"
            for _ in range(60):
                audience = random_audience(rng, rows)
                async with http.post(endpoint, json={"audience": audience}, headers=AUTH) as got:
                    answer = await got.json()
                assert (got.status, answer["listeners"]) == (200, len(brute_force(rows, audience)))
                assert answer["online"] == 0
            audience = [{"role": "admin"}, {"blogs": 7}]
            await bow.publish({"name": "news", "audience": audience}, fallback=1)
        deadline = asyncio.get_running_loop().time() + 20
        while not [s for s in receiver.received if s.body["type"] == "message.undelivered"]:
            assert asyncio.get_running_loop().time() < deadline, "no message.undelivered"
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # the rest of the message's events
        listed = [
            listener_id
            for seen in receiver.received
            if seen.body["type"] == "message.undelivered"
            for listener_id in seen.body["data"]["listeners"]
        ]
        assert len(listed) == len(set(listed)) and set(listed) == brute_force(rows, audience)
    finally:
        await bow.stop()
        await receiver.stop()
