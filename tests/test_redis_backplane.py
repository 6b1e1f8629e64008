"""The Redis backplane under faults: killed connections, a stopped or reset Redis, trimming."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio

from bow_gateway.backplanes import BackplaneUnavailable, Entry, Gap
from bow_gateway.backplanes.redis import RedisBackplane

from .support import until
from .support.redis_server import RedisServer, free_port

FAST = {"retry_backoff": 0.02, "max_backoff": 0.2, "publish_timeout": 0.5}


@pytest.fixture(autouse=True)
def _logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bow_gateway.backplanes.redis")


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture
async def admin(server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis(port=server.port)
    yield client
    await client.aclose()


@pytest.fixture
async def backplanes(server: RedisServer) -> AsyncIterator[Callable[..., RedisBackplane]]:
    """``backplanes(**options)``: a backplane on ``server``, disconnected at the end of the test."""
    made: list[RedisBackplane] = []

    def make(redis: Any = None, **options: Any) -> RedisBackplane:
        backplane = RedisBackplane(redis or server.url, **{**FAST, **options})
        made.append(backplane)
        return backplane

    yield make
    for backplane in made:
        await backplane.disconnect()


class Collector:
    """Collects a backplane's events in the background."""

    def __init__(self, backplane: RedisBackplane) -> None:
        self.events: list[bytes] = []  # the entries' data
        self.items: list[Entry | Gap] = []  # the entries and gaps
        self.task = asyncio.create_task(self._run(backplane))

    async def _run(self, backplane: RedisBackplane) -> None:
        async for item in backplane.events():
            self.items.append(item)
            if isinstance(item, Entry):
                self.events.append(item.data)

    async def until(self, count: int, timeout: float = 5.0) -> list[bytes]:
        """The events once there are ``count`` of them, and a moment more to catch extra ones."""
        async with asyncio.timeout(timeout):
            while len(self.events) < count:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        return self.events


async def kill_clients(admin: redis.asyncio.Redis) -> int:
    """``CLIENT KILL`` every connection but ``admin``'s."""
    killed: int = await admin.client_kill_filter(_type="normal", skipme=True)
    return killed


async def kill_blocked_read(admin: redis.asyncio.Redis, name: str) -> None:
    """``CLIENT KILL`` the connection named ``name`` once it blocks in ``XREAD``."""
    async with asyncio.timeout(5):
        while not (
            blocked := [
                c
                for c in await admin.client_list()
                if c.get("name") == name and c["cmd"] == "xread" and "b" in c["flags"]
            ]
        ):
            await asyncio.sleep(0.01)
    await admin.client_kill_filter(_id=blocked[0]["id"])


async def test_killed_reader_connections_lose_and_repeat_nothing(
    server: RedisServer, admin: redis.asyncio.Redis, backplanes: Callable[..., RedisBackplane]
) -> None:
    # The reader waits 0.1 s before it reconnects: the writer publishes meanwhile.
    reader = backplanes({"port": server.port, "client_name": "reader"}, retry_backoff=0.1)
    writer = backplanes()
    await reader.connect()
    await writer.connect()
    collector = Collector(reader)
    published = []
    for n in range(300):
        if n % 50 == 25:
            await kill_blocked_read(admin, "reader")
            await until(lambda: not reader.ready)
        await writer.publish(data := f"event {n}".encode())
        published.append(data)
    assert await collector.until(len(published)) == published
    assert reader.ready


async def test_every_connection_killed_while_publishing(
    admin: redis.asyncio.Redis, backplanes: Callable[..., RedisBackplane]
) -> None:
    reader, writer = backplanes(), backplanes()
    await reader.connect()
    await writer.connect()
    collector = Collector(reader)
    attempted, published = [], []

    async def publish(n: int) -> None:
        data = f"event {n}".encode()
        attempted.append(data)
        try:
            await writer.publish(data)
        except BackplaneUnavailable:
            return
        published.append(data)

    for n in range(300):
        await publish(n)
        if n % 30 == 15:
            await kill_clients(admin)
    assert len(published) > 250
    await publish(300)  # the writer works again
    await until(lambda: published[-1] in collector.events)
    seen = await collector.until(len(published))
    assert len(set(seen)) == len(seen), "an event was delivered twice"
    assert set(published) <= set(seen), "an accepted event was lost"
    assert seen == [data for data in attempted if data in seen], "events came out of order"


async def test_redis_down_refuses_quickly_then_resumes_without_loss(
    server: RedisServer, backplanes: Callable[..., RedisBackplane]
) -> None:
    reader = backplanes(retry_backoff=0.3, max_backoff=0.3)
    writer = backplanes()
    await reader.connect()
    await writer.connect()
    collector = Collector(reader)
    for n in range(10):
        await writer.publish(f"before {n}".encode())
    await collector.until(10)

    server.stop()
    await until(lambda: not reader.ready)
    started = time.monotonic()
    with pytest.raises(BackplaneUnavailable):
        await writer.publish(b"refused")
    assert time.monotonic() - started < FAST["publish_timeout"] + 0.5
    assert not writer.ready

    server.start()  # the AOF brings the stream back
    # The reader waits 0.3 s before it tries again: these are published while it is away.
    for n in range(10):
        await writer.publish(f"after {n}".encode())
    assert writer.ready
    await until(lambda: reader.ready)
    for n in range(10, 20):
        await reader.publish(f"after {n}".encode())
    expected = [f"before {n}".encode() for n in range(10)] + [
        f"after {n}".encode() for n in range(20)
    ]
    assert await collector.until(len(expected)) == expected


async def test_connections_closed_while_idle_cost_no_refusal(
    server: RedisServer, admin: redis.asyncio.Redis, backplanes: Callable[..., RedisBackplane]
) -> None:
    writer = backplanes()
    await writer.connect()
    # Several connections in the pool, all of them closed by Redis while idle.
    await asyncio.gather(*(writer.publish(b"warm-up") for _ in range(5)))
    server.restart()
    await asyncio.sleep(0.1)
    for n in range(10):
        await writer.publish(f"after a restart {n}".encode())
    await asyncio.gather(*(writer.publish(b"warm-up") for _ in range(5)))
    await kill_clients(admin)
    await asyncio.sleep(0.1)
    for n in range(10):
        await writer.publish(f"after CLIENT KILL {n}".encode())
    assert writer.ready


async def test_publish_times_out_on_a_redis_that_does_not_answer(
    server: RedisServer, backplanes: Callable[..., RedisBackplane]
) -> None:
    writer = backplanes()
    await writer.connect()
    await writer.publish(b"first")
    server.pause()  # connected, silent
    try:
        started = time.monotonic()
        with pytest.raises(BackplaneUnavailable, match="no answer within"):
            await writer.publish(b"second")
        assert time.monotonic() - started < FAST["publish_timeout"] + 0.5
        assert not writer.ready
    finally:
        server.resume()


async def test_a_redis_restarted_without_persistence_starts_a_new_epoch(
    backplanes: Callable[..., RedisBackplane], caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(appendonly=False).start()  # restarts empty
    try:
        reader, writer = backplanes(server.url), backplanes(server.url)
        await reader.connect()
        before = reader.epoch
        collector = Collector(reader)
        async with redis.asyncio.Redis(port=server.port) as client:
            # An id far ahead of the clock, as from a Redis whose clock was ahead.
            await client.xadd(reader.key, {b"d": b"from the future"}, id="99999999999999-0")
        await collector.until(1)
        server.restart()
        await writer.connect()
        position = await writer.publish(b"after the reset")
        items = await collector_items(collector, 3)
    finally:
        server.close()
    assert collector.events == [b"from the future", b"after the reset"]
    gap = items[1]
    assert isinstance(gap, Gap) and gap.reason == "epoch_changed"
    assert reader.epoch == writer.epoch != before
    assert gap.position.startswith(f"{reader.epoch}.")
    assert items[2] == Entry(position, b"after the reset")
    assert "history on the Redis stream" in caplog.text


async def collector_items(collector: Collector, count: int) -> list[Entry | Gap]:
    """The first ``count`` entries and gaps a collector took."""
    async with asyncio.timeout(5):
        while len(collector.items) < count:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    return collector.items


@pytest.mark.parametrize("command", [["FLUSHALL"], ["DEL", "{bow}:events"]], ids=["flush", "del"])
async def test_a_flushed_or_deleted_stream_starts_a_new_epoch(
    server: RedisServer,
    admin: redis.asyncio.Redis,
    backplanes: Callable[..., RedisBackplane],
    command: list[str],
) -> None:
    reader, writer = backplanes(), backplanes()
    await reader.connect()
    await writer.connect()
    collector = Collector(reader)
    first = await writer.publish(b"before")
    await collector.until(1)
    await admin.execute_command(*command)
    second = await writer.publish(b"after")
    items = await collector_items(collector, 3)
    assert items[0] == Entry(first, b"before")
    assert isinstance(items[1], Gap) and items[1].reason == "epoch_changed"
    assert items[2] == Entry(second, b"after")
    assert first.split(".")[0] != second.split(".")[0] == reader.epoch


async def test_a_history_gone_backwards_starts_one_new_epoch_for_every_instance(
    admin: redis.asyncio.Redis, backplanes: Callable[..., RedisBackplane]
) -> None:
    # As after a failover to a replica lacking the last entries: the same epoch key, a stream
    # whose last id is lower than what the instances read.
    readers = [backplanes(), backplanes()]
    for reader in readers:
        await reader.connect()
    collectors = [Collector(reader) for reader in readers]
    await readers[0].publish(b"lost by the failover")
    for collector in collectors:
        await collector.until(1)
    old = readers[0].epoch
    await admin.delete("{bow}:events")
    await admin.xadd("{bow}:events", {b"d": b"on the replica"}, id="1-1")
    gaps = [(await collector_items(collector, 2))[1] for collector in collectors]
    assert all(isinstance(gap, Gap) and gap.reason == "epoch_changed" for gap in gaps)
    assert readers[0].epoch == readers[1].epoch != old
    position = await readers[1].publish(b"after")
    for collector in collectors:
        assert (await collector_items(collector, 3))[2] == Entry(position, b"after")


async def test_trimmed_events_are_reported(
    backplanes: Callable[..., RedisBackplane], caplog: pytest.LogCaptureFixture
) -> None:
    with RedisServer(config={"stream-node-max-entries": 10}) as server:
        reader = backplanes(server.url, max_len=20, batch=7)
        writer = backplanes(server.url, max_len=20)
        await reader.connect()
        await writer.connect()
        published = [f"event {n}".encode() for n in range(200)]
        for data in published:
            await writer.publish(data)
        collector = Collector(reader)  # starts reading well behind
        await until(lambda: bool(collector.events) and collector.events[-1] == published[-1])
        await reader.disconnect()
        await writer.disconnect()
    kept = collector.events
    assert 20 <= len(kept) < 40 and kept == published[-len(kept) :]
    assert f"{200 - len(kept)} events were trimmed" in caplog.text
    gap = collector.items[0]
    assert isinstance(gap, Gap) and gap.reason == "trimmed"
    assert [item for item in collector.items if isinstance(item, Gap)] == [gap]
    after = reader.parse_position(gap.position)
    first = collector.items[1]
    assert isinstance(first, Entry) and after is not None
    assert after < reader.parse_position(first.position)  # type: ignore[operator]


async def test_startup_with_redis_unreachable_fails_clearly_after_the_retries() -> None:
    url = f"redis://user:secret@127.0.0.1:{free_port()}/0"
    backplane = RedisBackplane(url, connect_retries=2, retry_backoff=0.01)
    started = time.monotonic()
    with pytest.raises(
        BackplaneUnavailable, match=r"cannot reach Redis at .* after 3 attempts"
    ) as e:
        await backplane.connect()
    assert time.monotonic() - started < 2
    assert "secret" not in str(e.value)
    assert not backplane.ready


async def test_startup_waits_for_redis_within_the_retries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = RedisServer()
    backplane = RedisBackplane(server.url, connect_retries=20, retry_backoff=0.05, max_backoff=0.1)
    try:
        connecting = asyncio.create_task(backplane.connect())
        await asyncio.sleep(0.2)
        assert not connecting.done()
        server.start()
        await asyncio.wait_for(connecting, 3)
        assert backplane.ready
        await backplane.publish(b"hello")
        async for item in backplane.events():
            assert isinstance(item, Entry) and item.data == b"hello"
            break
    finally:
        await backplane.disconnect()
        server.close()
    assert "trying again" in caplog.text


async def test_namespaces_keep_gateways_apart(backplanes: Callable[..., RedisBackplane]) -> None:
    one, other = backplanes(namespace="one"), backplanes(namespace="other")
    await one.connect()
    await other.connect()
    assert one.key == "{one}:events"
    collectors = Collector(one), Collector(other)
    await one.publish(b"for one")
    await other.publish(b"for other")
    assert await collectors[0].until(1) == [b"for one"]
    assert await collectors[1].until(1) == [b"for other"]


@pytest.mark.parametrize(
    "settings",
    [{}, {"protocol": 3}, {"decode_responses": True}],
    ids=["RESP2", "RESP3", "decoding"],
)
async def test_a_dict_of_connection_settings(
    server: RedisServer, backplanes: Callable[..., RedisBackplane], settings: dict[str, Any]
) -> None:
    reader = backplanes({"host": "127.0.0.1", "port": server.port, "db": 3, **settings})
    writer = backplanes({"host": "127.0.0.1", "port": server.port, "db": 3, **settings})
    await reader.connect()
    await writer.connect()
    collector = Collector(reader)
    await writer.publish(b"\xff not UTF-8")
    await writer.publish(b"two")
    assert await collector.until(2) == [b"\xff not UTF-8", b"two"]
    async with redis.asyncio.Redis(port=server.port, db=3) as client:
        assert await client.xlen(writer.key) == 2


async def consume(backplane: RedisBackplane) -> None:
    async for _ in backplane.events():
        pass


async def test_a_consumer_cancelled_as_the_backplane_disconnects_is_cancelled(
    backplanes: Callable[..., RedisBackplane],
) -> None:
    backplane = backplanes()
    await backplane.connect()
    consumer = asyncio.create_task(consume(backplane))
    await asyncio.sleep(0.1)  # blocked in XREAD
    consumer.cancel()
    await backplane.disconnect()
    with pytest.raises(asyncio.CancelledError):
        await consumer


async def test_disconnect_ends_the_reads_at_once_while_a_publish_waits_for_redis(
    server: RedisServer, backplanes: Callable[..., RedisBackplane]
) -> None:
    # Regression: disconnect() waited for the publishes under way before interrupting the
    # reads, and any cancellation of a reader meanwhile was taken for its own.
    backplane = backplanes()
    await backplane.connect()
    consumer = asyncio.create_task(consume(backplane))
    await asyncio.sleep(0.1)
    server.pause()
    try:
        publishing = asyncio.create_task(backplane.publish(b"stuck"))
        await asyncio.sleep(0.05)
        disconnecting = asyncio.create_task(backplane.disconnect())
        await asyncio.wait({consumer}, timeout=FAST["publish_timeout"] / 2)
        assert consumer.done()
    finally:
        server.resume()
    await disconnecting
    with contextlib.suppress(BackplaneUnavailable):  # Redis may have answered too late
        await publishing


async def test_large_concurrent_events_go_in_several_pipelines_in_order(
    backplanes: Callable[..., RedisBackplane],
) -> None:
    writer, reader = backplanes(batch_bytes=1_000), backplanes()
    await writer.connect()
    await reader.connect()
    collector = Collector(reader)
    events = [f"{n:03} ".encode() + b"x" * 400 for n in range(20)]
    await asyncio.gather(*(writer.publish(data) for data in events))
    assert await collector.until(len(events)) == events
    collector.task.cancel()


async def test_a_batch_goes_in_one_pipeline_however_large(
    backplanes: Callable[..., RedisBackplane],
) -> None:
    writer, reader = backplanes(batch=10, batch_bytes=1_000), backplanes()
    await writer.connect()
    await reader.connect()
    collector = Collector(reader)
    sent: list[int] = []
    stream = writer._writer
    assert stream is not None
    xadd = stream._xadd

    async def counted(batch: list[Any]) -> list[Any]:
        sent.append(sum(len(events) for events, _, _ in batch))
        return await xadd(batch)

    stream._xadd = counted  # type: ignore[method-assign]
    events = [f"{n:03} ".encode() + b"x" * 100 for n in range(40)]  # 4 times both limits
    await writer.publish_many(events)
    assert sent == [40]
    assert await collector.until(len(events)) == events
    collector.task.cancel()


async def test_claims_of_a_dead_instance_no_longer_count(
    admin: redis.asyncio.Redis, backplanes: Callable[..., RedisBackplane]
) -> None:
    live = backplanes()
    await live.connect()
    assert await live.claim("user 1", "socket a", 2)
    # A crashed instance: its last heartbeat 10 s ago, one socket of user 1 still claimed.
    seconds, _ = await admin.time()
    await admin.zadd("{bow}:instances", {"crashed": seconds - 10})
    await admin.zadd("{bow}:sockets:user 1", {"crashed:socket x": seconds - 10})
    assert await live.claim("user 1", "socket b", 2)
    assert not await live.claim("user 1", "socket c", 2)
    assert await admin.zrange("{bow}:sockets:user 1", 0, -1) == [
        f"{live.instance_id}:socket a".encode(),
        f"{live.instance_id}:socket b".encode(),
    ]
