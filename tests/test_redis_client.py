"""One Redis client builder for every Redis user: each form of settings (a URL, a mapping, Redis
Sentinel, a Redis Cluster of three nodes, all on private servers) reaches the same data through
the asyncio and the synchronous client, and carries a snapshot from the criteria job's store and
writer to the precomputed-criteria middleware. (The backplane over each form: test_backplanes.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pyarrow
import pytest
from bow_gateway.middlewares.precomputed import PrecomputedCriteria

from bow_gateway import Bow
from bow_gateway.core.criteria_snapshot import Layout, Live
from bow_gateway.job.store import SnapshotStore
from bow_gateway.job.writer import HSET, write_partition
from bow_gateway.runtime.redis_client import (
    RedisSettings,
    check_settings,
    describe,
    redis_client,
    sync_redis_client,
)

from .support import base_config, until
from .support.redis_server import RedisServer, redis_cluster

FORMS = ["url", "mapping", "sentinel", "cluster"]
SERVICE = "bow-test"


@pytest.fixture(scope="module")
def single() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def sentinel(single: RedisServer) -> Iterator[RedisServer]:
    with RedisServer.sentinel(single, SERVICE) as server:
        yield server


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[RedisServer]]:
    with redis_cluster(3) as servers:
        yield servers


class Deployment:
    """The settings of one form, and the servers that hold its data."""

    def __init__(self, form: str, settings: RedisSettings, servers: list[RedisServer]) -> None:
        self.form = form
        self.settings = settings
        self.servers = servers

    def keys(self) -> list[int]:
        """How many keys each server holds."""
        return [int(server.command("DBSIZE").lstrip(":")) for server in self.servers]

    def subscribers(self, channel: str) -> int:
        """Subscribers of ``channel`` over every server (a cluster's are on one node)."""
        replies = [s.command("PUBSUB", "NUMSUB", channel, first_line=False) for s in self.servers]
        return sum(int(reply.split("\r\n")[-2].lstrip(":")) for reply in replies)


@pytest.fixture(params=FORMS)
def deployment(request: pytest.FixtureRequest, single: RedisServer) -> Deployment:
    """Each form of settings, its servers emptied first."""
    form = request.param
    if form == "cluster":
        servers: list[RedisServer] = request.getfixturevalue("cluster")
        settings: RedisSettings = [{"host": "127.0.0.1", "port": s.port} for s in servers]
    else:
        servers = [single]
        settings = {
            "url": single.url,
            "mapping": {"host": "127.0.0.1", "port": single.port},
            "sentinel": {
                "sentinels": [f"127.0.0.1:{request.getfixturevalue('sentinel').port}"],
                "service_name": SERVICE,
            },
        }[form]
    for server in servers:
        server.command("FLUSHALL")
    return Deployment(form, settings, servers)


async def test_the_asyncio_and_the_sync_client_reach_the_same_data(
    deployment: Deployment,
) -> None:
    client = redis_client(deployment.settings)
    try:
        for n in range(30):
            await client.set(f"key {n}", n)
    finally:
        await client.aclose()
    sync = sync_redis_client(deployment.settings)
    try:
        assert [int(sync.get(f"key {n}")) for n in range(30)] == list(range(30))  # type: ignore[arg-type]
    finally:
        sync.close()
    assert sum(deployment.keys()) == 30


async def test_cluster_settings_spread_keys_over_every_node(cluster: list[RedisServer]) -> None:
    deployment = Deployment("cluster", [{"host": "127.0.0.1", "port": cluster[1].port}], cluster)
    for server in cluster:
        server.command("FLUSHALL")
    client = redis_client(deployment.settings)  # one startup node is enough to find the others
    try:
        for n in range(30):
            await client.set(f"key {n}", n)
    finally:
        await client.aclose()
    assert all(count > 0 for count in deployment.keys()), deployment.keys()


def connections_to(server: RedisServer) -> int:
    return len(server.command("CLIENT", "LIST", first_line=False).strip().splitlines())


async def test_closing_a_sentinel_client_closes_its_connections_to_the_sentinels(
    single: RedisServer, sentinel: RedisServer
) -> None:
    settings: RedisSettings = {
        "sentinels": [["127.0.0.1", sentinel.port]],
        "service_name": SERVICE,
    }
    before = connections_to(sentinel)
    client = redis_client(settings)
    await client.set("through", "sentinel")
    sync = sync_redis_client(settings)
    assert sync.get("through") == b"sentinel"
    assert connections_to(sentinel) > before
    await client.aclose()
    sync.close()
    await until(lambda: connections_to(sentinel) == before, "the sentinel connections closed")


async def test_settings_win_over_defaults_and_forced_options_over_settings(
    single: RedisServer,
) -> None:
    settings: RedisSettings = {"host": "127.0.0.1", "port": single.port, "decode_responses": False}
    client = redis_client(settings, defaults={"decode_responses": True})
    forced = redis_client(settings, decode_responses=True)
    try:
        await client.set("k", "v")
        assert await client.get("k") == b"v"
        assert await forced.get("k") == "v"
    finally:
        await client.aclose()
        await forced.aclose()


@pytest.mark.parametrize(
    "settings",
    [
        "redis://user:s3cret@127.0.0.1:6379/0",
        {"host": "10.0.0.5", "password": "s3cret"},
        {"sentinels": ["s1:26379"], "service_name": "main", "password": "s3cret"},
        [{"host": "node1", "port": 7000, "password": "s3cret"}],
    ],
    ids=["url", "mapping", "sentinel", "cluster"],
)
def test_a_description_says_where_redis_is_never_the_password(settings: Any) -> None:
    text = describe(settings)
    assert "s3cret" not in text
    assert any(where in text for where in ("127.0.0.1:6379", "10.0.0.5", "s1:26379", "node1"))


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ("", "must be a redis:// URL"),
        ([], "must be a redis:// URL"),
        (["redis://a"], "must be a redis:// URL"),
        (42, "must be a redis:// URL"),
        ([{"port": 7000}], "every Redis Cluster node needs a host"),
        ({"service_name": "main"}, 'Redis Sentinel needs "sentinels"'),
        ({"sentinels": ["s1"], "service_name": "main"}, 'a sentinel is "host:port"'),
        ({"sentinels": ["s1:26379"]}, 'Redis Sentinel needs "service_name"'),
    ],
    ids=[
        "empty-url",
        "no-nodes",
        "nodes-not-mappings",
        "a-number",
        "node-without-host",
        "no-sentinels",
        "sentinel-without-port",
        "no-service-name",
    ],
)
def test_malformed_settings_are_refused_saying_why(settings: Any, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        check_settings(settings)
    with pytest.raises(ValueError, match=f"redis: .*{reason}"):
        Bow(base_config(redis=settings))


# -- the criteria job's store and writer, then the middleware --------------------------------------

LISTENERS = {f"USER/{n}": "admin" if n % 3 == 0 else "author" for n in range(300)}
BUCKETS = 30
LAYOUT = Layout("bow")


def bulk(text: str) -> bytes:
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def entries() -> pyarrow.RecordBatch:
    """The rows the job's Spark SQL makes for ``LISTENERS``: ``HSET`` arguments by bucket."""
    rows = []
    for listener_id, role in LISTENERS.items():
        key, field = LAYOUT.key_of("s1", BUCKETS, listener_id)
        rows.append((int(key.rsplit(":", 1)[1]), bulk(field) + bulk(json.dumps([role]))))
    return pyarrow.RecordBatch.from_pydict(
        {
            "bucket": pyarrow.array([bucket for bucket, _ in rows], pyarrow.int32()),
            "entry": pyarrow.array([entry for _, entry in rows], pyarrow.binary()),
            "op": pyarrow.array([HSET] * len(rows), pyarrow.int8()),
            "notify": pyarrow.array([None] * len(rows), pyarrow.string()),
        }
    )


@pytest.fixture
async def middleware(deployment: Deployment) -> AsyncIterator[PrecomputedCriteria]:
    made = PrecomputedCriteria(redis=deployment.settings, namespace=LAYOUT.namespace)
    yield made
    await made.aclose()


async def test_a_snapshot_the_job_writes_goes_live_for_the_middleware(
    deployment: Deployment, middleware: PrecomputedCriteria
) -> None:
    changes = middleware.watch()
    heard = asyncio.ensure_future(anext(changes))
    try:
        await until(lambda: deployment.subscribers(LAYOUT.changes_channel) == 1, "a subscriber")
        client = sync_redis_client(deployment.settings)
        try:
            with SnapshotStore(client, LAYOUT, lock_seconds=10) as store:
                store.begin("s1", BUCKETS)
                [stats] = write_partition(
                    iter([entries()]), redis=deployment.settings, prefix=LAYOUT.bucket_prefix("s1")
                )
                assert stats.column("listeners").to_pylist() == [len(LISTENERS)]
                assert store.count("s1", BUCKETS) == len(LISTENERS)
                store.go_live(Live("s1", BUCKETS, keys=("role",)), None, grace_seconds=60)
        finally:
            client.close()
        assert await asyncio.wait_for(heard, 5) is None  # a new snapshot: every listener
    finally:
        heard.cancel()
        await changes.aclose()  # type: ignore[attr-defined]  # an async generator
    for listener_id, role in LISTENERS.items():
        assert await middleware({"id": listener_id}) == {"role": role}
    if deployment.form == "cluster":
        assert all(count > 0 for count in deployment.keys()), deployment.keys()
