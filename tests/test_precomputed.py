"""The precomputed-criteria middleware and the Redis layout it shares with the criteria job.

Snapshots are written here the way the job writes them (bucket hashes, the live pointer, a
notification), with a private ``redis-server``; the job itself is tested in test_criteria_job.py.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
from bow_gateway.middlewares.precomputed import PrecomputedCriteria

from bow_gateway.core.criteria_snapshot import (
    Layout,
    Live,
    bucket_count,
    bucket_of,
    id_field,
    ids_message,
    parse_change,
    snapshot_message,
)
from bow_gateway.job.store import LockHeld, SnapshotStore

from .support.redis_server import RedisServer

LAYOUT = Layout("bow")


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(server.url)
    connection.flushall()
    yield connection
    connection.close()


@pytest.fixture
async def middleware(server: RedisServer) -> AsyncIterator[PrecomputedCriteria]:
    made = PrecomputedCriteria(redis=server.url, namespace="bow")
    yield made
    await made.aclose()


def publish_snapshot(
    client: redis.Redis, snapshot: str, criteria: dict[Any, dict[str, Any]], buckets: int = 3
) -> Live:
    """Write a snapshot as the job does, switch the pointer to it and notify."""
    pipe = client.pipeline(transaction=False)
    for listener_id, value in criteria.items():
        key, field = LAYOUT.key_of(snapshot, buckets, listener_id)
        pipe.hset(key, field, json.dumps(value, separators=(",", ":")))
    pipe.execute()
    live = Live(snapshot, buckets)
    client.set(LAYOUT.live_key, live.to_json())
    client.publish(LAYOUT.changes_channel, snapshot_message(snapshot))
    return live


def test_id_field_is_compact_json_and_numbers_differ_from_strings() -> None:
    assert id_field(1) == "1"
    assert id_field("1") == '"1"'
    assert id_field(42.0) == "42"  # the listener 42, as everywhere in the gateway
    assert id_field(1.5) == "1.5"
    assert id_field("é/日本") == '"é/日本"'  # raw UTF-8, as Spark's to_json writes it
    assert id_field('a"b\\c') == '"a\\"b\\\\c"'
    assert id_field("\x0b\x1f\n") == '"\\u000B\\u001F\\n"'  # Jackson's upper-case hex
    assert id_field("\\u001f") == '"\\\\u001f"'  # a literal backslash-u stays as it is
    for bad in (True, None, "", float("nan"), [1]):
        with pytest.raises(ValueError):
            id_field(bad)  # type: ignore[arg-type]


def test_bucket_is_crc32_of_the_field_modulo_the_count() -> None:
    assert bucket_of('"alice"', 7) == zlib.crc32(b'"alice"') % 7
    assert bucket_count(0) == 1
    assert bucket_count(100) == 1
    assert bucket_count(101) == 2
    assert bucket_count(1_000_000) == 10_000
    assert LAYOUT.bucket_key("s1", 4) == "bow:criteria:s1:4"


def test_live_pointer_and_notifications_round_trip() -> None:
    live = Live("20250101T000000Zab12", 10, "/state/x")
    assert Live.from_json(live.to_json()) == live
    keyed = Live("20250101T000000Zab12", 10, "/state/x", ("role", "blogId"))
    assert Live.from_json(keyed.to_json()) == keyed
    assert Live.from_json(None) is None
    for bad in ("{", '{"snapshot": "a:b", "buckets": 1}', '{"snapshot": "a", "buckets": 0}'):
        with pytest.raises(ValueError, match="malformed live criteria pointer"):
            Live.from_json(bad)
    with pytest.raises(ValueError, match="bad keys"):
        Live.from_json('{"snapshot": "a", "buckets": 1, "keys": [""]}')
    assert parse_change(snapshot_message("s")) is None
    assert parse_change(ids_message([id_field(1), id_field("1")])) == [1, "1"]
    with pytest.raises(ValueError):
        parse_change('{"ids": [true]}')


def test_stored_values_are_read_by_position_or_as_objects() -> None:
    keyed = Live("s", 1, keys=("role", "blogId", "beta"))
    assert keyed.criteria(b'["author",[42,418]]') == {"role": "author", "blogId": [42, 418]}
    assert keyed.criteria(b"[null,[42]]") == {"blogId": [42]}
    assert keyed.criteria(b"[]") == {}
    assert Live("s", 1).criteria(b'{"role":"admin"}') == {"role": "admin"}  # no keys: objects
    for bad in (b'["a","b","c","d"]', b'{"role":"admin"}'):
        with pytest.raises(ValueError, match="do not fit"):
            keyed.criteria(bad)


def test_coded_strings_are_read_through_the_pointers_codes() -> None:
    codes = (("free", "pro"), None, ("subscriber", "author"))
    coded = Live("s", 1, "/state/x", ("plan", "blogId", "role"), codes)
    raw = coded.to_json()
    assert json.loads(raw) == {
        "snapshot": "s",
        "buckets": 1,
        "layout": 2,
        "columns": ["plan", "blogId", "role"],
        "codes": [["free", "pro"], None, ["subscriber", "author"]],
        "state": "/state/x",
    }
    assert "keys" not in json.loads(raw)  # a reader of layout 1 would take codes for values
    assert Live.from_json(raw) == coded
    assert coded.criteria(b"[1,[42,418],[1,0]]") == {
        "plan": "pro",
        "blogId": [42, 418],  # numbers in a column without codes stay numbers
        "role": ["author", "subscriber"],
    }
    # a string without a code is stored as it is; missing and trailing values as before
    assert coded.criteria(b'["team",null,[0,"admin"]]') == {
        "plan": "team",
        "role": ["subscriber", "admin"],
    }
    assert coded.criteria(b"[0]") == {"plan": "free"}
    for bad in (b"[2]", b"[-1]", b"[0,null,[0,5]]"):
        with pytest.raises(ValueError, match="a code the pointer has not"):
            coded.criteria(bad)
    with pytest.raises(ValueError, match="do not fit"):
        coded.criteria(b'{"plan":"pro"}')


def test_a_pointer_of_an_unknown_layout_or_with_bad_codes_is_refused() -> None:
    with pytest.raises(ValueError, match="layout 3, which this gateway does not read"):
        Live.from_json('{"snapshot": "s", "buckets": 1, "layout": 3, "columns": ["a"]}')
    for codes in ('[["a"], null]', '[[""]]', "[[1]]", '{"a": ["x"]}'):
        pointer = f'{{"snapshot":"s","buckets":1,"layout":2,"columns":["a"],"codes":{codes}}}'
        with pytest.raises(ValueError, match="bad codes"):
            Live.from_json(pointer)
    with pytest.raises(ValueError, match="malformed"):
        Live.from_json('{"snapshot": "s", "buckets": 1, "layout": 2, "keys": ["a"]}')


async def test_a_coded_snapshot_is_read_by_the_middleware(
    client: redis.Redis, middleware: PrecomputedCriteria
) -> None:
    live = Live("s2", 1, None, ("plan", "role"), (("free", "pro"), ("admin",)))
    client.hset(LAYOUT.bucket_key("s2", 0), mapping={"7": '[1,[0,"x"]]', '"u"': '["team"]'})
    client.set(LAYOUT.live_key, live.to_json())
    assert await middleware({"id": 7}) == {"plan": "pro", "role": ["admin", "x"]}
    assert await middleware({"id": "u"}) == {"plan": "team"}


async def test_criteria_come_from_the_live_snapshot(
    client: redis.Redis, middleware: PrecomputedCriteria
) -> None:
    publish_snapshot(client, "s1", {1: {"role": ["admin"]}, "1": {"role": "reader"}, "u2": {}})
    assert await middleware({"id": 1}) == {"role": ["admin"]}
    assert await middleware({"id": 1.0}) == {"role": ["admin"]}
    assert await middleware({"id": "1"}) == {"role": "reader"}  # "1" is not 1
    assert await middleware({"id": "u2"}) == {}  # known, without criteria
    with pytest.raises(LookupError, match="'nobody' has no precomputed criteria"):
        await middleware({"id": "nobody"})


async def test_a_new_snapshot_is_read_at_once_even_without_notification(
    client: redis.Redis, middleware: PrecomputedCriteria
) -> None:
    publish_snapshot(client, "s1", {"alice": {"role": "reader"}})
    assert await middleware({"id": "alice"}) == {"role": "reader"}
    publish_snapshot(client, "s2", {"alice": {"role": "admin"}, "bob": {"role": "admin"}})
    # bob is missing from the cached snapshot: the pointer is read again on a miss
    assert await middleware({"id": "bob"}) == {"role": "admin"}
    assert await middleware({"id": "alice"}) == {"role": "admin"}


async def test_no_snapshot_yet_is_refused_with_a_clear_message(
    client: redis.Redis, middleware: PrecomputedCriteria
) -> None:
    with pytest.raises(LookupError, match=r"no precomputed criteria yet.*criteria-job"):
        await middleware({"id": "alice"})


async def test_unknown_ids_fall_back_to_another_middleware(
    client: redis.Redis, server: RedisServer
) -> None:
    async def fallback(details: Any) -> dict[str, Any]:
        return {"guest": True, "name": details["id"]}

    middleware = PrecomputedCriteria(server.url, fallback=fallback)
    try:
        assert await middleware({"id": "alice"}) == {"guest": True, "name": "alice"}
        publish_snapshot(client, "s1", {"alice": {"role": "reader"}})
        assert await middleware({"id": "alice"}) == {"role": "reader"}
        assert await middleware({"id": "carol"}) == {"guest": True, "name": "carol"}
    finally:
        await middleware.aclose()
    with pytest.raises(ValueError, match="fallback"):
        PrecomputedCriteria(server.url, fallback="not callable")  # type: ignore[arg-type]


async def test_watch_yields_none_for_a_snapshot_and_ids_for_changes(
    client: redis.Redis, server: RedisServer
) -> None:
    middleware = PrecomputedCriteria({"host": "127.0.0.1", "port": server.port}, ping_interval=0.2)
    changes = middleware.watch()
    try:
        publish_snapshot(client, "s1", {"alice": {"role": "reader"}})
        assert await middleware({"id": "alice"}) == {"role": "reader"}
        first = asyncio.ensure_future(anext(changes))
        await asyncio.sleep(0.2)  # subscribed
        publish_snapshot(client, "s2", {"alice": {"role": "admin"}})
        assert await asyncio.wait_for(first, 5) is None
        assert await middleware({"id": "alice"}) == {"role": "admin"}  # the pointer was re-read
        client.publish(LAYOUT.changes_channel, "not json")  # ignored, with a warning
        client.publish(LAYOUT.changes_channel, ids_message([id_field("alice"), id_field(7)]))
        assert await asyncio.wait_for(anext(changes), 5) == ["alice", 7]
        # Redis goes away and comes back: notifications may have been missed, so None.
        server.restart()
        client.connection_pool.disconnect()  # the test's own connection died with the server
        assert await asyncio.wait_for(anext(changes), 10) is None
        client.publish(LAYOUT.changes_channel, ids_message([id_field("bob")]))
        assert await asyncio.wait_for(anext(changes), 5) == ["bob"]
    finally:
        await changes.aclose()
        await middleware.aclose()


def test_the_lock_lets_one_job_run_at_a_time(client: redis.Redis) -> None:
    with SnapshotStore(client, LAYOUT, lock_seconds=5) as first:
        with pytest.raises(LockHeld, match="another criteria job is running"):
            SnapshotStore(client, LAYOUT, lock_seconds=5).__enter__()
        assert client.get(LAYOUT.lock_key) == first.token.encode()
    assert client.get(LAYOUT.lock_key) is None
    with SnapshotStore(client, LAYOUT, lock_seconds=5):
        pass


def test_the_lock_is_renewed_while_the_job_runs(client: redis.Redis) -> None:
    with SnapshotStore(client, LAYOUT, lock_seconds=3):
        time.sleep(3.5)
        assert client.pttl(LAYOUT.lock_key) > 1000


def test_clean_up_removes_crashed_and_expired_snapshots_but_not_the_live_one(
    client: redis.Redis,
) -> None:
    live = publish_snapshot(client, "live1", {"a": {}, "b": {}}, buckets=2)
    with SnapshotStore(client, LAYOUT) as store:
        store.begin("crashed", 2)
        client.hset(LAYOUT.bucket_key("crashed", 0), "x", "{}")
        store.begin("old", 2)
        client.hset(LAYOUT.bucket_key("old", 1), "y", "{}")
        store.retire(Live("old", 2), grace_seconds=0.001)
        time.sleep(0.01)
        store.begin("recent", 1)
        client.hset(LAYOUT.bucket_key("recent", 0), "z", "{}")
        store.retire(Live("recent", 1), grace_seconds=60)
        assert 0 < client.pttl(LAYOUT.bucket_key("recent", 0)) <= 60_000
        assert sorted(store.clean_up()) == ["crashed", "old"]
        assert set(store.registry()) == {"recent"}
        assert client.exists(LAYOUT.bucket_key("crashed", 0)) == 0
        assert client.exists(LAYOUT.bucket_key("recent", 0)) == 1
        assert store.live() == live
        assert store.count("live1", 2) == 2


def guest(details: Any) -> dict[str, Any]:
    """A fallback named by reference in the test below."""
    return {"guest": True}


async def test_redis_from_the_environment_and_a_fallback_by_name(
    client: redis.Redis, server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BOW_REDIS_URL", server.url)
    middleware = PrecomputedCriteria(fallback="tests.test_precomputed:guest")
    try:
        assert await middleware({"id": "anyone"}) == {"guest": True}
    finally:
        await middleware.aclose()
    monkeypatch.delenv("BOW_REDIS_URL")
    with pytest.raises(ValueError, match="BOW_REDIS_URL is not set"):
        PrecomputedCriteria()
    with pytest.raises(ValueError, match=r"fallback: cannot import 'tests\.test_precomputed:nope'"):
        PrecomputedCriteria(server.url, fallback="tests.test_precomputed:nope")
    assert "redis://" not in repr(PrecomputedCriteria(server.url))


async def test_the_standalone_configuration_builds_it(server: RedisServer, tmp_path: Any) -> None:
    from bow_gateway.app.standalone import build_bow, load_settings

    path = tmp_path / "gateway.toml"
    path.write_text(
        'port = 0\n[inbound]\nrealm = "r"\nusername = "u"\npassword = "p"\n'
        "[outbound]\ntimeout = 5\n"
        '[[middlewares]]\nversion = "v1"\ncreate_criteria_from_listener_details = '
        '"bow_gateway.middlewares.precomputed:PrecomputedCriteria"\n'
        f'options = {{ redis = "{server.url}", namespace = "bow" }}\n'
        '[[outbounds]]\nversion = "v1"\ncreate_listener_details_from_token = '
        '"bow_gateway.outbounds.jwt:JwtOutbound"\n'
        'options = { secret = "a-test-secret-that-is-at-least-32-bytes-long" }\n'
        'middleware_version = "v1"\n'
    )
    bow = build_bow(load_settings(str(path), environ={}))
    [middleware] = bow._middlewares.values()
    assert isinstance(middleware, PrecomputedCriteria)
    assert middleware.layout.live_key == "{bow:criteria}:live"
