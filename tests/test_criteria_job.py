"""The Spark criteria job, for real: local Spark (Java 17), PostgreSQL, Parquet, redis-server.

One Spark session serves the whole module (a cold one costs ~15 s). PostgreSQL is the one at
127.0.0.1:5432 (database ``test``): each run of this module uses its own schema, dropped at the
end. Every test has its own Redis namespace on one private ``redis-server``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import redis
from bow_gateway.middlewares.precomputed import PrecomputedCriteria
from criteria_data import (
    QUERY,
    Dataset,
    churn,
    expected_criteria,
    generate,
    write_parquet,
)
from criteria_data import write_postgres as load_postgres
from pyspark.sql import SparkSession

from bow_gateway import Bow
from bow_gateway.cli import main as cli_main
from bow_gateway.core.criteria_snapshot import Layout, Live, id_field, parse_change
from bow_gateway.job.config import JobConfig, parse_job_config
from bow_gateway.job.run import CriteriaJobError, run_job
from bow_gateway.job.spark import build_session

from .support import AUTH, Listener, base_config
from .support.redis_server import RedisServer

LISTENERS = 2000
JAR = "/usr/share/java/postgresql.jar"
DSN = os.environ.get("BOW_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
JDBC = "jdbc:postgresql://127.0.0.1:5432/test"
SCHEMA = f"bow_criteria_job_{os.getpid()}"

# A cold Spark session and a dozen runs: more than the suite's default of 120 s per test.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    # Criteria longer than Redis's default 64 bytes stay in listpacks (see docs/criteria-job.md).
    with RedisServer(config={"hash-max-listpack-value": 512}) as started:
        yield started


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """The module's Spark session, with the JDBC driver (a jar must be there at start)."""
    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
    document = job_config("redis://unused", "SELECT 1 AS id", [_jdbc("t", table="t")], conf=conf)
    session = build_session(parse_job_config(document))
    yield session
    session.stop()


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    """Users, roles and memberships (bench/criteria_data.py)."""
    return generate(LISTENERS, seed=7)


@pytest.fixture(scope="module")
def postgres(dataset: Dataset) -> Iterator[str]:
    """The data set in PostgreSQL, in this module's own schema (dropped at the end)."""
    asyncio.run(load_postgres(dataset, DSN, SCHEMA))
    yield SCHEMA
    asyncio.run(_sql(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE'))


@pytest.fixture(scope="module")
def parquet(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same data set as Parquet files: ``users.parquet``, ``roles.parquet``..."""
    folder = tmp_path_factory.mktemp("parquet")
    write_parquet(dataset, folder)
    return folder


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    return f"t{zlib.crc32(request.node.name.encode())}"


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(server.url)
    yield connection
    connection.close()


# -- helpers --------------------------------------------------------------------------------------


async def _sql(*statements: str) -> None:
    connection = await asyncpg.connect(DSN)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


def _jdbc(name: str, **options: Any) -> dict[str, Any]:
    return {"name": name, "format": "jdbc", "url": JDBC, "user": "postgres", "jar": JAR, **options}


def _parquet(folder: Path, *names: str) -> list[dict[str, Any]]:
    return [{"name": n, "format": "parquet", "path": str(folder / f"{n}.parquet")} for n in names]


def job_config(
    redis_url: str,
    query: str,
    inputs: list[dict[str, Any]] | None = None,
    namespace: str = "bow",
    conf: dict[str, str] | None = None,
    **snapshot: Any,
) -> dict[str, Any]:
    return {
        "redis": {"url": redis_url, "namespace": namespace},
        "inputs": inputs or [],
        "criteria": {"query": query},
        "snapshot": {"lock_seconds": 10, "grace_seconds": 30, **snapshot},
        **({"spark": {"conf": conf}} if conf else {}),
    }


def run(document: dict[str, Any], spark: SparkSession, **kwargs: Any) -> Any:
    config: JobConfig = parse_job_config(document)
    return run_job(config, spark, **kwargs)


def contents(client: redis.Redis, namespace: str) -> dict[str, Any]:
    """Every listener of the live snapshot: field -> criteria."""
    layout = Layout(namespace)
    live = Live.from_json(client.get(layout.live_key))
    assert live is not None
    found: dict[str, Any] = {}
    for bucket in range(live.buckets):
        for field, value in client.hgetall(layout.bucket_key(live.snapshot, bucket)).items():
            found[field.decode()] = live.criteria(value)
    return found


def expected(data: Any) -> dict[str, Any]:
    return {id_field(listener): criteria for listener, criteria in expected_criteria(data).items()}


def fake_live(client: redis.Redis, namespace: str) -> Live:
    """A live snapshot with one listener, to show that a failed run leaves it alone."""
    layout = Layout(namespace)
    live = Live("previous", 1)
    client.hset(layout.bucket_key("previous", 0), id_field(1), '{"role":["old"]}')
    client.set(layout.live_key, live.to_json())
    return live


def assert_untouched(client: redis.Redis, namespace: str, live: Live) -> None:
    layout = Layout(namespace)
    assert Live.from_json(client.get(layout.live_key)) == live
    assert contents(client, namespace) == {"1": {"role": ["old"]}}
    others = [k for k in client.scan_iter(f"{layout.prefix}*") if b":previous:" not in k]
    assert others == []  # no partial snapshot
    assert client.exists(layout.lock_key) == 0


# -- full runs ------------------------------------------------------------------------------------


def test_full_run_from_postgresql_holds_every_listener(
    spark: SparkSession,
    server: RedisServer,
    client: redis.Redis,
    dataset: Dataset,
    postgres: str,
    namespace: str,
) -> None:
    partitioned = {
        "partition_column": "id",
        "lower_bound": 1,
        "upper_bound": LISTENERS,
        "num_partitions": 3,
    }
    inputs = [
        _jdbc("users", table=f"{SCHEMA}.users", **partitioned),
        _jdbc("roles", table=f"{SCHEMA}.roles"),
        _jdbc(
            "memberships",
            query=f"SELECT user_id, role_id, blog_id FROM {SCHEMA}.memberships",
            partition_column="user_id",
            lower_bound=1,
            upper_bound=LISTENERS,
            num_partitions=2,
        ),
    ]
    summary = run(job_config(server.url, QUERY, inputs, namespace), spark)
    assert (summary.mode, summary.read, summary.written, summary.removed) == (
        "full",
        LISTENERS,
        LISTENERS,
        0,
    )
    assert summary.buckets == LISTENERS // 100
    assert contents(client, namespace) == expected(dataset)
    layout = Layout(namespace)
    bucket = layout.bucket_key(summary.snapshot, 0)
    assert client.object("encoding", bucket) == b"listpack"
    assert client.get(layout.lock_key) is None  # released


def test_full_run_from_parquet_then_incremental_runs(
    spark: SparkSession,
    server: RedisServer,
    client: redis.Redis,
    dataset: Dataset,
    parquet: Path,
    namespace: str,
    tmp_path: Path,
) -> None:
    layout = Layout(namespace)
    names = ("users", "roles", "memberships")
    state = str(tmp_path / "state")
    first = run(
        job_config(server.url, QUERY, _parquet(parquet, *names), namespace, state_dir=state), spark
    )
    assert contents(client, namespace) == expected(dataset)
    second = run(
        job_config(server.url, QUERY, _parquet(parquet, *names), namespace, state_dir=state), spark
    )
    assert second.snapshot != first.snapshot
    # the replaced snapshot expires after the grace period; the live one never does
    assert 0 < client.pttl(layout.bucket_key(first.snapshot, 0)) <= 30_000
    assert client.pttl(layout.bucket_key(second.snapshot, 0)) == -1

    changed, touched = churn(dataset, 0.02, seed=3)
    write_parquet(changed, tmp_path / "changed")
    notifications = client.pubsub()
    notifications.subscribe(layout.changes_channel)
    summary = run(
        job_config(
            server.url, QUERY, _parquet(tmp_path / "changed", *names), namespace, state_dir=state
        ),
        spark,
        incremental=True,
    )
    assert summary.mode == "incremental" and summary.snapshot == second.snapshot
    now = expected(changed)
    before = expected(dataset)
    written = {f for f, c in now.items() if before.get(f) != c}
    removed = set(before) - set(now)
    assert (summary.written, summary.removed) == (len(written), len(removed))
    assert 0 < summary.written + summary.removed <= touched
    assert contents(client, namespace) == now
    heard: set[Any] = set()
    while (message := notifications.get_message(timeout=1)) is not None:
        if message["type"] == "message":
            heard.update(parse_change(message["data"]) or [])
    notifications.close()
    assert {id_field(i) for i in heard} == written | removed

    again = run(
        job_config(
            server.url, QUERY, _parquet(tmp_path / "changed", *names), namespace, state_dir=state
        ),
        spark,
        incremental=True,
    )
    assert (again.written, again.removed) == (0, 0)  # idempotent: nothing changed since
    assert not [
        p
        for p in Path(state).iterdir()
        if p.name != Path(Live.from_json(client.get(layout.live_key)).state or "").name
    ]  # type: ignore[union-attr]


def test_an_incremental_run_after_the_columns_changed_is_a_full_run(
    spark: SparkSession, server: RedisServer, client: redis.Redis, namespace: str, tmp_path: Path
) -> None:
    # Values are stored by position: diffing them against a snapshot of other columns would
    # write criteria under the wrong keys. Also a regression test: string ids with only columns
    # that cannot hold a bad value (here integers) failed with "`problem` cannot be resolved".
    state = str(tmp_path / "state")
    rows = "FROM VALUES ('a', 1), ('b', 2) AS t(id, n)"
    run(job_config(server.url, f"SELECT id, n {rows}", namespace=namespace, state_dir=state), spark)
    big = "CASE WHEN n > 1 THEN true END AS big"  # NULL for 'a': a null in the middle
    summary = run(
        job_config(server.url, f"SELECT id, {big}, n {rows}", namespace=namespace, state_dir=state),
        spark,
        incremental=True,
    )
    assert summary.mode == "full"
    assert contents(client, namespace) == {
        id_field("a"): {"n": 1},
        id_field("b"): {"big": True, "n": 2},
    }
    # the same key, once strings with codes, now numbers: they would read as codes
    kinds = "FROM VALUES ('a', 'x'), ('b', 'x') AS t(id, k)"
    document = job_config(server.url, f"SELECT id, k {kinds}", namespace=namespace, state_dir=state)
    run(document, spark)
    live = Live.from_json(client.get(Layout(namespace).live_key))
    assert live is not None and live.codes == (("x",),)
    summary = run(
        job_config(server.url, f"SELECT id, 0 AS k {kinds}", namespace=namespace, state_dir=state),
        spark,
        incremental=True,
    )
    assert summary.mode == "full"
    assert contents(client, namespace) == {id_field("a"): {"k": 0}, id_field("b"): {"k": 0}}


def test_ids_and_values_reach_redis_as_the_gateway_encodes_them(
    spark: SparkSession, server: RedisServer, client: redis.Redis, namespace: str
) -> None:
    ids = ["alice", "1", "é/日本", 'q"uote\\', "tab\there", "\x0bctl\x1f", "😀"]
    rows = ", ".join(f"({_literal(i)}, {n})" for n, i in enumerate(ids))
    query = (
        f"SELECT id, n AS rank, n % 2 = 0 AS even, CAST(n AS double) / 4 AS quarter,"
        f" CAST(n AS decimal(5, 2)) AS price, array('b', 'a', 'b', NULL) AS tags,"
        f" CASE WHEN n > 0 THEN 'x' END AS maybe, array(CAST(NULL AS int)) AS empty"
        f" FROM VALUES {rows} AS t(id, n)"
    )
    run(job_config(server.url, query, namespace=namespace), spark)
    layout = Layout(namespace)
    live = Live.from_json(client.get(layout.live_key))
    assert live is not None
    assert live.keys == ("rank", "even", "quarter", "price", "tags", "maybe", "empty")
    # the strings that many listeners hold have codes, most frequent first (ties by the string)
    assert live.codes == (None, None, None, None, ("a", "b"), ("x",), None)
    stored = client.hget(layout.bucket_key(live.snapshot, 0), id_field("1"))
    # the keys once in the pointer, the values by position, strings as their codes, trailing
    # NULLs left out
    assert stored == b"[1,false,0.25,1.00,[0,1],0]"
    found = contents(client, namespace)
    assert found == {
        id_field(i): {
            "rank": n,
            "even": n % 2 == 0,
            "quarter": n / 4,
            "price": n,
            "tags": ["a", "b"],
            **({"maybe": "x"} if n > 0 else {}),
        }
        for n, i in enumerate(ids)
    }
    numbers = "SELECT CAST(id AS bigint) AS id, 'n' AS kind FROM VALUES (1), (20), (300) AS t(id)"
    run(job_config(server.url, numbers, namespace=namespace), spark)
    assert contents(client, namespace) == {
        "1": {"kind": "n"},
        "20": {"kind": "n"},
        "300": {"kind": "n"},
    }


def _literal(text: str) -> str:
    """A Spark SQL string literal for any text (no escape sequences needed)."""
    return (
        "concat(" + ", ".join(f"char({ord(c)})" if ord(c) < 128 else f"'{c}'" for c in text) + ")"
    )


# -- failures -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("select", "message"),
    [
        ("id, nope", "nope"),
        ("id, current_date() AS since", "'since' has type date"),
        ("id, map('a', 1) AS settings", "'settings' has type map<string,int>"),
        ("id, array(array(1)) AS nested", "'nested' has type array<array<int>>"),
        ("id, named_struct('a', 1) AS thing", "'thing' has type struct"),
        ("id, NULL AS nothing", "'nothing' has type void"),
        ("CAST(id AS double) AS id, plan", "column 'id' has type double"),
        ("plan", "must return an 'id' column"),
        ("id, plan AS __id", "'__id'"),
        ("id, '' AS nickname", "column 'nickname' is an empty string"),
        ("id, CAST('NaN' AS double) AS score", "column 'score' is NaN or an infinity"),
        ("id, array('a', '') AS tags", "column 'tags' holds an empty string"),
        ("CASE WHEN id = 5 THEN '' ELSE CAST(id AS string) END AS id", "id is empty"),
        ("id, plan FROM users UNION ALL SELECT 7, 'twice'", "appear in more than one row"),
    ],
)
def test_a_bad_query_fails_naming_the_column_and_leaves_the_live_snapshot_alone(
    spark: SparkSession,
    server: RedisServer,
    client: redis.Redis,
    parquet: Path,
    namespace: str,
    select: str,
    message: str,
) -> None:
    live = fake_live(client, namespace)
    document = job_config(
        server.url, f"SELECT {select} FROM users", _parquet(parquet, "users"), namespace
    )
    with pytest.raises(CriteriaJobError, match=message):
        run(document, spark)
    assert_untouched(client, namespace, live)


def test_an_input_that_cannot_be_read_is_named_among_inputs_opened_together(
    spark: SparkSession,
    server: RedisServer,
    client: redis.Redis,
    parquet: Path,
    tmp_path: Path,
    namespace: str,
) -> None:
    live = fake_live(client, namespace)
    inputs = [
        *_parquet(parquet, "users", "roles"),
        {"name": "missing", "format": "parquet", "path": str(tmp_path / "nowhere.parquet")},
        *_parquet(parquet, "memberships"),
    ]
    document = job_config(server.url, QUERY, inputs, namespace)
    with pytest.raises(CriteriaJobError, match="input 'missing': cannot read it"):
        run(document, spark)
    assert_untouched(client, namespace, live)


def test_a_run_that_fails_while_writing_leaves_the_live_snapshot_alone(
    spark: SparkSession, server: RedisServer, client: redis.Redis, parquet: Path, namespace: str
) -> None:
    live = fake_live(client, namespace)
    document = job_config(
        server.url, QUERY, _parquet(parquet, "users", "roles", "memberships"), namespace
    )
    used = int(client.info("memory")["used_memory"])
    # room for a small part of the listeners (with 100 KB, a third, the run once fitted whole:
    # used_memory had been measured with transient buffers in it)
    client.config_set("maxmemory", used + 20_000)
    try:
        with pytest.raises(CriteriaJobError, match="used memory > 'maxmemory'"):
            run(document, spark)
    finally:
        client.config_set("maxmemory", 0)
    assert_untouched(client, namespace, live)


def test_an_incremental_run_that_fails_while_writing_makes_the_next_run_a_full_one(
    spark: SparkSession,
    server: RedisServer,
    client: redis.Redis,
    dataset: Dataset,
    parquet: Path,
    namespace: str,
    tmp_path: Path,
) -> None:
    # Regression: it wrote part of its changes into the live snapshot and left the previous
    # state in place, so that later incremental runs diffed against contents that no longer
    # were, and never rewrote what they thought unchanged.
    names = ("users", "roles", "memberships")
    state = str(tmp_path / "state")
    run(job_config(server.url, QUERY, _parquet(parquet, *names), namespace, state_dir=state), spark)
    changed, _ = churn(dataset, 0.5, seed=5)
    write_parquet(changed, tmp_path / "changed")
    document = job_config(
        server.url, QUERY, _parquet(tmp_path / "changed", *names), namespace, state_dir=state
    )
    layout = Layout(namespace)
    before = Live.from_json(client.get(layout.live_key))
    assert before is not None and before.state is not None
    broken = layout.bucket_key(before.snapshot, 0)  # HSET into it fails: WRONGTYPE
    client.delete(broken)
    client.set(broken, "not a hash")
    with pytest.raises(CriteriaJobError, match="WRONGTYPE"):
        run(document, spark, incremental=True)
    client.delete(broken)
    live = Live.from_json(client.get(layout.live_key))
    assert live is not None and live.state is None
    (tmp_path / "state" / "not-ours").mkdir()  # the sweep leaves what it did not make
    summary = run(document, spark, incremental=True)
    assert summary.mode == "full"
    assert contents(client, namespace) == expected(changed)
    live = Live.from_json(client.get(layout.live_key))
    assert live is not None and live.state is not None
    # the crashed run's predecessor's state is swept with the rest
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == sorted(
        [Path(live.state).name, "not-ours"]
    )


def test_one_run_at_a_time_and_a_killed_run_is_cleaned_up_by_the_next(
    spark: SparkSession, server: RedisServer, client: redis.Redis, parquet: Path, namespace: str
) -> None:
    layout = Layout(namespace)
    live = fake_live(client, namespace)
    # What a run killed while writing leaves: its lock (until it expires) and a partial snapshot
    client.set(layout.lock_key, "the-killed-run", px=1500)
    client.hset(layout.registry_key, "killed", json.dumps({"buckets": 2, "status": "writing"}))
    client.hset(layout.bucket_key("killed", 1), "1", "{}")
    document = job_config(
        server.url, QUERY, _parquet(parquet, "users", "roles", "memberships"), namespace
    )
    with pytest.raises(CriteriaJobError, match="another criteria job is running"):
        run(document, spark)
    assert Live.from_json(client.get(layout.live_key)) == live
    time.sleep(1.6)
    summary = run(document, spark)
    assert client.exists(layout.bucket_key("killed", 1)) == 0
    assert set(client.hkeys(layout.registry_key)) == {summary.snapshot.encode(), b"previous"}
    assert len(contents(client, namespace)) == LISTENERS


def test_the_command_line_runs_the_job(
    spark: SparkSession,
    server: RedisServer,
    client: redis.Redis,
    parquet: Path,
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        f'[redis]\nurl = "{server.url}"\nnamespace = "{namespace}"\n'
        f'[[inputs]]\nname = "users"\nformat = "parquet"\npath = "{parquet}/users.parquet"\n'
        '[criteria]\nquery = "SELECT id, plan FROM users"\n'
    )
    assert cli_main(["criteria-job", "--config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "full run done" in out and "2,000" in out
    assert "criteria query: 2,000 listeners" in err
    assert len(contents(client, namespace)) == LISTENERS
    path.write_text(
        f'[redis]\nurl = "{server.url}"\n[criteria]\nquery = "SELECT 1 AS id"\n'
        "[snapshot]\nbuckets = 0\n"
    )
    assert cli_main(["criteria-job", "--config", str(path)]) == 2
    assert "snapshot.buckets: must be a whole number >= 1" in capsys.readouterr().err


# -- end to end -----------------------------------------------------------------------------------


async def test_a_connected_listener_starts_and_another_stops_receiving_after_an_incremental_run(
    spark: SparkSession,
    server: RedisServer,
    postgres: str,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Alice gains the admin role in PostgreSQL, Bob loses it: nobody reconnects."""
    users, roles = f"{SCHEMA}.e2e_users", f"{SCHEMA}.e2e_roles"
    await _sql(
        f"CREATE TABLE {users} (name text PRIMARY KEY, plan text)",
        f"CREATE TABLE {roles} (name text, role text)",
        f"INSERT INTO {users} VALUES ('alice', 'free'), ('bob', 'pro'), ('carol', 'pro')",
        f"INSERT INTO {roles} VALUES ('alice', 'reader'), ('bob', 'admin'), ('bob', 'reader')",
    )
    query = (
        "SELECT u.name AS id, u.plan, collect_set(r.role) AS role FROM users u"
        " LEFT JOIN roles r ON r.name = u.name GROUP BY u.name, u.plan"
    )
    document = job_config(
        server.url,
        query,
        [_jdbc("users", table=users), _jdbc("roles", table=roles)],
        namespace,
        state_dir=str(tmp_path / "state"),
    )
    await asyncio.to_thread(run, document, spark)

    middleware = PrecomputedCriteria(server.url, namespace=namespace)
    bow = (
        Bow(base_config())
        .middleware(version="1", create_criteria_from_listener_details=middleware)
        .inbound(
            path="/in", create_message_from_request_body=lambda body: body, middleware_version="1"
        )
        .outbound(
            version="1",
            create_listener_details_from_token=lambda token: {"id": token},
            middleware_version="1",
        )
    )
    await bow.start()
    url = f"http://127.0.0.1:{bow.port}"
    alice, bob, mallory = Listener(url), Listener(url), Listener(url)
    try:
        for name, client in (("alice", alice), ("bob", bob)):
            await client.connect("1")
            await client.authenticate(name)
        await mallory.connect("1")
        await mallory.client.emit("authenticate", "mallory", callback=lambda *_: None)
        assert (await mallory.next_event())[0] == "alert"  # not in the snapshot: refused
        assert "'mallory'" in str(mallory.alerts[0])

        async def post(name: str) -> None:
            async with aiohttp.ClientSession() as http:
                body = {"name": name, "audience": [{"role": "admin"}]}
                async with http.post(url + "/in", json=body, headers=AUTH) as response:
                    assert response.status == 204

        await post("BEFORE")
        assert (await bob.next_event())[0] == "BEFORE"
        await alice.no_event()

        await _sql(
            f"INSERT INTO {roles} VALUES ('alice', 'admin')",
            f"DELETE FROM {roles} WHERE name = 'bob' AND role = 'admin'",
        )
        summary = await asyncio.to_thread(run, document, spark, incremental=True)
        assert (summary.written, summary.removed) == (2, 0)
        index = bow._outbound.indices["1"]  # type: ignore[union-attr]
        for _ in range(200):
            if "admin" in index.criteria_of("alice").get("role", []):
                break
            await asyncio.sleep(0.025)
        await post("AFTER")
        assert (await alice.next_event())[0] == "AFTER"
        await bob.no_event()
        assert alice.client.connected and bob.client.connected
        assert index.criteria_of("bob") == {"plan": "pro", "role": ["reader"], "__id": "bob"}
    finally:
        for listener in (alice, bob, mallory):
            await listener.close()
        await bow.stop()
