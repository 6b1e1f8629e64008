"""The Spark criteria job over a Redis Cluster of three masters (the job file's
``redis.connection``, in the form of the gateway's ``redis`` setting): a full run spreads its
buckets over every node, an incremental run writes and notifies only what changed, the
precomputed-criteria middleware reads the result through the same settings, and the bench's wide
shape (string ids, 12 criteria, long strings) arrives as generated."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bow_gateway.middlewares.precomputed import PrecomputedCriteria
from criteria_data import (
    QUERY,
    WIDE_QUERY,
    churn,
    expected_criteria,
    expected_wide_criteria,
    generate,
    generate_wide,
    write_parquet,
)
from pyspark.sql import SparkSession

from bow_gateway.core.criteria_snapshot import Layout, Live, id_field, parse_change
from bow_gateway.job.config import load_job_config, parse_job_config
from bow_gateway.job.run import run_job
from bow_gateway.job.spark import build_session
from bow_gateway.runtime.config import load_config
from bow_gateway.runtime.redis_client import RedisSettings, SyncClient, sync_redis_client

from .support import base_config
from .support.redis_server import RedisServer, redis_cluster

LISTENERS = 600
WIDE_LISTENERS = 1000
NAMES = ("users", "roles", "memberships")
# 300 s: a Spark session of its own
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[RedisServer]]:
    with redis_cluster(3) as servers:
        yield servers


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
    session = build_session(parse_job_config(document("redis://unused", [], spark={"conf": conf})))
    yield session
    session.stop()


def document(redis: RedisSettings, inputs: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    connection = {"url": redis} if isinstance(redis, str) else {"connection": redis}
    return {"redis": connection, "inputs": inputs, "criteria": {"query": QUERY}, **more}


def parquet(folder: Path) -> list[dict[str, Any]]:
    return [{"name": n, "format": "parquet", "path": str(folder / f"{n}.parquet")} for n in NAMES]


def contents(client: SyncClient, layout: Layout) -> dict[str, Any]:
    """Every listener of the live snapshot: field -> criteria."""
    live = Live.from_json(client.get(layout.live_key))  # type: ignore[arg-type]
    assert live is not None
    found: dict[str, Any] = {}
    for bucket in range(live.buckets):
        for field, value in client.hgetall(layout.bucket_key(live.snapshot, bucket)).items():  # type: ignore[union-attr]
            found[field.decode()] = live.criteria(value)
    return found


def expected(dataset: Any) -> dict[str, Any]:
    return {id_field(i): criteria for i, criteria in expected_criteria(dataset).items()}


async def test_full_and_incremental_runs_over_a_redis_cluster(
    spark: SparkSession, cluster: list[RedisServer], tmp_path: Path
) -> None:
    # The nodes as a gateway's TOML file gives its `redis` setting, and the same text as the
    # job file's `redis.connection`: one form, one result.
    nodes = ", ".join(f'{{ host = "127.0.0.1", port = {s.port} }}' for s in cluster)
    settings: RedisSettings = load_config(base_config(**tomllib.loads(f"redis = [{nodes}]"))).redis
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        f'[redis]\nconnection = [{nodes}]\n[criteria]\nquery = """{QUERY}"""\n'
        + "".join(
            f'[[inputs]]\nname = "{n}"\nformat = "parquet"\npath = "first/{n}.parquet"\n'
            for n in NAMES
        )
        + '[snapshot]\nstate_dir = "state"\nlock_seconds = 10\nbuckets = 30\n'
    )
    layout = Layout("bow")
    dataset = generate(LISTENERS, seed=11)
    write_parquet(dataset, tmp_path / "first")
    state = {"snapshot": {"state_dir": str(tmp_path / "state"), "lock_seconds": 10, "buckets": 30}}
    client = sync_redis_client(settings)
    try:
        config = load_job_config(str(job_file))
        assert config.redis == settings == [{"host": "127.0.0.1", "port": s.port} for s in cluster]
        full = run_job(config, spark)
        assert (full.mode, full.written) == ("full", LISTENERS)
        assert contents(client, layout) == expected(dataset)
        assert all(int(s.command("DBSIZE").lstrip(":")) > 0 for s in cluster)  # buckets everywhere

        changed, _ = churn(dataset, 0.05, seed=3)
        write_parquet(changed, tmp_path / "changed")
        notifications = client.pubsub()  # type: ignore[union-attr]
        notifications.subscribe(layout.changes_channel)
        again = parse_job_config(document(settings, parquet(tmp_path / "changed"), **state))
        incremental = run_job(again, spark, incremental=True)
        before, now = expected(dataset), expected(changed)
        written = {field for field, criteria in now.items() if before.get(field) != criteria}
        removed = set(before) - set(now)
        assert incremental.mode == "incremental"
        assert (incremental.written, incremental.removed) == (len(written), len(removed))
        assert contents(client, layout) == now
        heard: set[Any] = set()
        while (message := notifications.get_message(timeout=1)) is not None:
            if message["type"] == "message":
                heard.update(parse_change(message["data"]) or [])
        notifications.close()
        assert {id_field(listener) for listener in heard} == written | removed
    finally:
        client.close()

    middleware = PrecomputedCriteria(redis=settings, namespace=layout.namespace)
    try:
        for field, criteria in list(now.items())[:50]:
            assert await middleware({"id": int(field)}) == criteria
    finally:
        await middleware.aclose()


def test_the_wide_shape_string_ids_and_long_criteria_over_a_redis_cluster(
    spark: SparkSession, cluster: list[RedisServer], tmp_path: Path
) -> None:
    settings: RedisSettings = [{"host": "127.0.0.1", "port": s.port} for s in cluster]
    wide = generate_wide(WIDE_LISTENERS, seed=5)
    write_parquet(wide, tmp_path)
    inputs = [
        {"name": n, "format": "parquet", "path": str(tmp_path / f"{n}.parquet")}
        for n in ("accounts", "group_members")
    ]
    document = {
        "redis": {"connection": settings, "namespace": "wide"},
        "inputs": inputs,
        "criteria": {"query": WIDE_QUERY},
    }
    said: list[str] = []
    summary = run_job(parse_job_config(document), spark, progress=said.append)
    assert summary.written == WIDE_LISTENERS
    client = sync_redis_client(settings)
    try:
        found = contents(client, Layout("wide"))
    finally:
        client.close()
    assert found == {id_field(i): c for i, c in expected_wide_criteria(wide).items()}
    # the criteria are longer than Redis's default listpack value (64 bytes): the job says so
    assert any("exceed the Redis setting hash-max-listpack-value 64" in line for line in said)
