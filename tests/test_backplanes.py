"""The backplane contract, run against every backend: in-process, Redis, Redis Cluster and Redis
through Sentinel (each on private servers). What only one backend does is tested beside it
(test_redis_backplane.py: Redis under faults)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

import pytest

from bow_gateway.backplanes import (
    AlreadyAccepted,
    Backplane,
    BackplaneUnavailable,
    Claim,
    Entry,
    Gap,
    MemoryBackplane,
    Report,
    Retention,
)
from bow_gateway.backplanes.redis import RedisBackplane

from .support.redis_server import RedisServer


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisServer]:
    with RedisServer(cluster=True) as server:
        yield server


@pytest.fixture(scope="module")
def redis_sentinel(redis_server: RedisServer) -> Iterator[RedisServer]:
    """A Sentinel that names ``redis_server`` the master of ``gateway``."""
    with RedisServer.sentinel(redis_server, "gateway") as sentinel:
        yield sentinel


BOUND = 3  # events an in-process backplane holds undelivered in the tests of its bound
PUBLISH_TIMEOUT = 0.3  # seconds Redis has to take an event in those tests


class Backend:
    """Makes connected backplanes; ``shared``: whether they are instances of one gateway."""

    def __init__(self, kind: str, server: RedisServer | None, sentinel: RedisServer | None) -> None:
        self.kind = kind
        self.shared = kind != "memory"
        self.server = server  # the Redis server that holds the stream
        self.sentinel = sentinel
        self.namespace = f"test-{uuid.uuid4().hex[:8]}"  # the module's tests share one server
        self.made: list[Backplane] = []

    def new(self, bounded: bool = False) -> Backplane:
        """A backplane (not connected); ``bounded``: one that soon refuses (see :meth:`unable`)."""
        backplane: Backplane
        if self.server is None:
            backplane = MemoryBackplane(max_pending=BOUND if bounded else 10_000)
        else:
            redis: Any = self.server.url
            if self.kind == "cluster":
                redis = [{"host": "127.0.0.1", "port": self.server.port}]
            elif self.kind == "sentinel":
                assert self.sentinel is not None
                redis = {
                    "sentinels": [f"127.0.0.1:{self.sentinel.port}"],
                    "service_name": "gateway",
                }
            # A long block shows that disconnect() interrupts the blocking read.
            backplane = RedisBackplane(
                redis,
                namespace=self.namespace,
                block_ms=10_000,
                publish_timeout=PUBLISH_TIMEOUT if bounded else 2.0,
            )
        self.made.append(backplane)
        return backplane

    @contextlib.asynccontextmanager
    async def unable(self, backplane: Backplane) -> AsyncIterator[None]:
        """While inside, ``backplane`` cannot take another event: the in-process one holds its
        bound undelivered, Redis does not answer (stopped with SIGSTOP)."""
        if self.server is None:
            for n in range(BOUND):
                await backplane.publish(f"held {n}".encode())
            yield
            return
        self.server.pause()
        try:
            yield
        finally:
            self.server.resume()

    async def connected(self) -> Backplane:
        backplane = self.new()
        await backplane.connect()
        return backplane


@pytest.fixture(params=["memory", "redis", "cluster", "sentinel"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    async for made in _backend(request):
        yield made


@pytest.fixture(params=["redis", "cluster", "sentinel"])
async def shared_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """The backends whose instances are one gateway (an in-process one has a single instance)."""
    async for made in _backend(request):
        yield made


async def _backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    fixture = {"redis": "redis_server", "cluster": "redis_cluster", "sentinel": "redis_server"}
    name = fixture.get(request.param)
    server = request.getfixturevalue(name) if name else None
    sentinel = request.getfixturevalue("redis_sentinel") if request.param == "sentinel" else None
    backend = Backend(request.param, server, sentinel)
    yield backend
    for backplane in backend.made:
        await backplane.disconnect()


async def items(backplane: Backplane, count: int, timeout: float = 5.0) -> list[Entry | Gap]:
    """The next ``count`` entries and gaps of ``backplane``."""
    got: list[Entry | Gap] = []
    events = backplane.events()
    try:
        async with asyncio.timeout(timeout):
            async for item in events:
                got.append(item)
                if len(got) == count:
                    break
    finally:
        if isinstance(events, AsyncGenerator):
            await events.aclose()
    return got


async def take(backplane: Backplane, count: int, timeout: float = 5.0) -> list[bytes]:
    """The data of the next ``count`` events of ``backplane`` (a gap fails the test)."""
    got = await items(backplane, count, timeout)
    assert all(isinstance(item, Entry) for item in got), got
    return [item.data for item in got if isinstance(item, Entry)]


def numbered(count: int, prefix: str = "event") -> list[bytes]:
    return [f"{prefix} {n}".encode() for n in range(count)]


async def test_ready_once_connected_and_no_longer_after_disconnect(backend: Backend) -> None:
    backplane = backend.new()
    assert not backplane.ready
    await backplane.connect()
    assert backplane.ready
    await backplane.disconnect()
    assert not backplane.ready


async def test_events_come_out_in_publish_order(backend: Backend) -> None:
    backplane = await backend.connected()
    events = numbered(200)
    for data in events:
        await backplane.publish(data)
    assert await take(backplane, len(events)) == events


async def test_concurrent_publishes_are_all_taken_in_the_order_they_were_made(
    backend: Backend,
) -> None:
    # Regression: the Redis backplane gave each publish a connection of its own, so 300 at once
    # were refused past the pool's limit ("Too many connections") and could land out of order.
    backplane = await backend.connected()
    events = numbered(300)
    await asyncio.gather(*(backplane.publish(data) for data in events))
    assert await take(backplane, len(events)) == events


async def test_events_are_opaque_bytes(backend: Backend) -> None:
    backplane = await backend.connected()
    events = [b"", b"\x00\xff\r\n", "é ✓".encode(), b"x" * 100_000]
    for data in events:
        await backplane.publish(data)
    assert await take(backplane, len(events)) == events


async def test_a_later_events_call_resumes_where_the_last_one_stopped(backend: Backend) -> None:
    backplane = await backend.connected()
    for data in numbered(6):
        await backplane.publish(data)
    assert await take(backplane, 2) == numbered(6)[:2]
    assert await take(backplane, 4) == numbered(6)[2:]


async def test_events_start_at_connect(backend: Backend) -> None:
    if backend.shared:
        earlier = await backend.connected()
        await earlier.publish(b"before")
    backplane = await backend.connected()
    await backplane.publish(b"after")
    assert await take(backplane, 1) == [b"after"]


async def test_events_end_promptly_after_disconnect(backend: Backend) -> None:
    backplane = await backend.connected()
    await backplane.publish(b"one")
    got: list[bytes] = []

    async def consume() -> None:
        async for item in backplane.events():
            assert isinstance(item, Entry)
            got.append(item.data)

    consumer = asyncio.create_task(consume())
    while not got:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the consumer now waits for the next event
    async with asyncio.timeout(1.0):  # Redis blocks for 10 s: disconnect() must interrupt it
        await backplane.disconnect()
        await consumer
    assert got == [b"one"]


async def test_publish_after_disconnect_is_refused(backend: Backend) -> None:
    backplane = await backend.connected()
    await backplane.disconnect()
    with pytest.raises(BackplaneUnavailable):
        await backplane.publish(b"late")
    async with asyncio.timeout(1):
        assert [data async for data in backplane.events()] == []


async def test_publish_before_connect_is_refused(backend: Backend) -> None:
    with pytest.raises(BackplaneUnavailable):
        await backend.new().publish(b"early")


async def test_instances_of_one_gateway_see_all_events_in_one_order(
    shared_backend: Backend,
) -> None:
    first, second = await shared_backend.connected(), await shared_backend.connected()
    events = numbered(100)
    for n, data in enumerate(events):
        await (first if n % 3 else second).publish(data)
    assert await take(first, len(events)) == events
    assert await take(second, len(events)) == events


async def test_concurrent_publishers_agree_on_one_order(shared_backend: Backend) -> None:
    first, second = await shared_backend.connected(), await shared_backend.connected()
    a, b = numbered(100, "a"), numbered(100, "b")

    async def publish_all(backplane: Backplane, events: list[bytes]) -> None:
        for data in events:
            await backplane.publish(data)

    await asyncio.gather(publish_all(first, a), publish_all(second, b))
    seen_first, seen_second = await take(first, 200), await take(second, 200)
    assert seen_first == seen_second
    assert [e for e in seen_first if e.startswith(b"a")] == a
    assert [e for e in seen_first if e.startswith(b"b")] == b


async def test_an_event_it_cannot_take_is_refused_promptly_with_a_retry_delay(
    backend: Backend,
) -> None:
    backplane = backend.new(bounded=True)
    await backplane.connect()
    async with backend.unable(backplane):
        started = time.monotonic()
        with pytest.raises(BackplaneUnavailable) as refused:
            await backplane.publish(b"refused")
        assert time.monotonic() - started < PUBLISH_TIMEOUT + 1.0
    assert refused.value.retry_after > 0


async def test_once_it_can_again_it_takes_and_delivers_events(backend: Backend) -> None:
    backplane = backend.new(bounded=True)
    await backplane.connect()
    async with backend.unable(backplane):
        with pytest.raises(BackplaneUnavailable):
            await backplane.publish(b"refused")
    if not backend.shared:  # the in-process one must first deliver what it holds
        assert await take(backplane, BOUND) == numbered(BOUND, "held")
    await backplane.publish(b"after")
    # A refused event may still be delivered (Redis may apply it late), never one accepted lost.
    async with asyncio.timeout(5):
        while (await take(backplane, 1))[0] != b"after":
            pass


async def test_positions_increase_and_are_those_events_yield(backend: Backend) -> None:
    backplane = await backend.connected()
    published = [await backplane.publish(data) for data in numbered(20)]
    published += await asyncio.gather(*(backplane.publish(b"at once") for _ in range(20)))
    read = await items(backplane, 40)
    assert [item.position for item in read] == published
    keys = [backplane.parse_position(position) for position in published]
    assert all(key is not None and key[0] == backplane.epoch for key in keys)
    assert [key for key in keys if key] == sorted(key for key in keys if key)
    assert len(set(published)) == 40


async def test_publish_many_delivers_in_order_and_returns_the_positions_events_yield(
    backend: Backend,
) -> None:
    backplane = await backend.connected()
    first = await backplane.publish(b"before")
    positions = await backplane.publish_many(numbered(5))
    read = await items(backplane, 6)
    assert [item.data for item in read if isinstance(item, Entry)] == [b"before", *numbered(5)]
    assert [item.position for item in read] == [first, *positions]
    keys = [backplane.parse_position(position) for position in [first, *positions]]
    assert all(key is not None for key in keys)
    assert [key for key in keys if key] == sorted(key for key in keys if key)
    assert len(set(positions)) == 5


async def test_publish_many_of_nothing_publishes_nothing(backend: Backend) -> None:
    backplane = await backend.connected()
    assert await backplane.publish_many([]) == []
    await backplane.publish(b"after")
    assert await take(backplane, 1) == [b"after"]


async def test_a_batch_stays_whole_among_concurrent_publishes(backend: Backend) -> None:
    backplane = await backend.connected()
    batch = numbered(50, "batch")
    singles = numbered(20, "single")
    await asyncio.gather(
        *(backplane.publish(data) for data in singles[:10]),
        backplane.publish_many(batch),
        *(backplane.publish(data) for data in singles[10:]),
    )
    got = await take(backplane, 70)
    start = got.index(batch[0])
    assert got[start : start + 50] == batch
    assert [data for data in got if data.startswith(b"single")] == singles


async def test_a_batch_larger_than_a_pipeline_is_taken_whole_in_order(backend: Backend) -> None:
    backplane = await backend.connected()
    batch = numbered(1_200)  # over the Redis backplane's 500 events a pipeline
    positions = await backplane.publish_many(batch)
    assert len(positions) == len(set(positions)) == 1_200
    read = await items(backplane, 1_200)
    assert [item.position for item in read] == positions
    assert [item.data for item in read if isinstance(item, Entry)] == batch


async def test_publish_many_before_connect_or_after_disconnect_is_refused(
    backend: Backend,
) -> None:
    with pytest.raises(BackplaneUnavailable):
        await backend.new().publish_many([b"early"])
    backplane = await backend.connected()
    await backplane.disconnect()
    with pytest.raises(BackplaneUnavailable):
        await backplane.publish_many([b"late", b"later"])


async def test_a_batch_it_cannot_take_is_refused_promptly(backend: Backend) -> None:
    backplane = backend.new(bounded=True)
    await backplane.connect()
    async with backend.unable(backplane):
        started = time.monotonic()
        with pytest.raises(BackplaneUnavailable) as refused:
            await backplane.publish_many(numbered(3, "refused"))
        assert time.monotonic() - started < PUBLISH_TIMEOUT + 1.0
    assert refused.value.retry_after > 0


async def test_positions_are_short_ascii_and_parsed_while_garbage_is_not(backend: Backend) -> None:
    backplane = await backend.connected()
    position = await backplane.publish(b"one")
    assert position.isascii() and len(position) <= 64
    assert backplane.parse_position(position) is not None
    epoch = backplane.epoch
    assert epoch.isascii() and epoch and "." not in epoch
    garbage = ["", ".", "x", f"{epoch}.", f".{position}", f"{position}.1", f"{position}x"]
    garbage += [f"{epoch}.-1", f"{epoch}.1 ", "é.1", f"{epoch}.{'9' * 70}", "a.b-c"]
    for text in garbage:
        assert backplane.parse_position(text) is None, text


async def test_backlog_is_the_newest_entries_before_connect_oldest_first(
    backend: Backend,
) -> None:
    published: list[str] = []
    if backend.shared:
        earlier = await backend.connected()
        published = [await earlier.publish(data) for data in numbered(10)]
    backplane = await backend.connected()
    backlog = await backplane.backlog(4)
    assert [entry.position for entry in backlog] == published[-4:]
    assert [entry.data for entry in backlog] == (numbered(10)[-4:] if backend.shared else [])
    await backplane.publish(b"after")
    assert await take(backplane, 1) == [b"after"]  # events() continues after the backlog


async def answering(backplane: Backplane, reply: bytes) -> asyncio.Task[None]:
    """A consumer that answers every ``ask {id}`` event it reads with ``reply``."""

    async def consume() -> None:
        async for item in backplane.events():
            if isinstance(item, Entry) and item.data.startswith(b"ask "):
                await backplane.answer(item.data[4:].decode(), reply)

    return asyncio.create_task(consume())


async def test_answers_of_every_instance_are_collected_complete(backend: Backend) -> None:
    asker = await backend.connected()
    instances = [asker, *([await backend.connected()] if backend.shared else [])]
    consumers = [await answering(b, f"from {n}".encode()) for n, b in enumerate(instances)]
    request = uuid.uuid4().hex
    answers, complete = await asker.answers(
        request, lambda: asker.publish(f"ask {request}".encode()), timeout=5.0
    )
    assert complete
    assert sorted(answers) == [f"from {n}".encode() for n in range(len(instances))]
    for backplane in instances:  # ends the consumers
        await backplane.disconnect()
    await asyncio.gather(*consumers)


async def test_answers_are_incomplete_when_an_instance_does_not_answer_in_time(
    backend: Backend,
) -> None:
    asker = await backend.connected()
    consumers = []
    if backend.shared:  # the asker answers; a second instance is live but never answers
        await backend.connected()
        consumers.append(await answering(asker, b"mine"))
    request = uuid.uuid4().hex
    started = time.monotonic()
    answers, complete = await asker.answers(
        request, lambda: asker.publish(f"ask {request}".encode()), timeout=0.3
    )
    assert not complete
    assert answers == ([b"mine"] if backend.shared else [])
    assert 0.3 <= time.monotonic() - started < 2.0
    await asker.disconnect()  # ends the consumer
    await asyncio.gather(*consumers)


async def test_a_claim_over_the_limit_is_refused(backend: Backend) -> None:
    first = await backend.connected()
    second = await backend.connected() if backend.shared else first
    assert await first.claim("user 1", "socket a", 2)
    assert await second.claim("user 1", "socket b", 2)
    assert await first.claim("user 1", "socket a", 2)  # already held: still held
    assert not await second.claim("user 1", "socket c", 2)
    assert await second.claim("user 2", "socket c", 2)  # another key


async def test_a_claim_with_limit_0_is_never_refused(backend: Backend) -> None:
    backplane = await backend.connected()
    assert all([await backplane.claim("user 1", f"socket {n}", 0) for n in range(50)])


async def test_release_frees_a_claim(backend: Backend) -> None:
    first = await backend.connected()
    second = await backend.connected() if backend.shared else first
    assert await first.claim("user 1", "socket a", 1)
    assert not await second.claim("user 1", "socket b", 1)
    await first.release("user 1", "socket a")
    await first.release("user 1", "never claimed")
    assert await second.claim("user 1", "socket b", 1)


# -- leases (a Flywheel sessionId held by one identity on every instance) -----------------------
# A lease is held by one owner; each instance's hold of it lasts its ttl unless renewed, and the
# lease is free once no instance holds it.

TTL = 30.0  # seconds: longer than any test, but where a test waits for a hold to end


async def test_a_lease_is_held_by_one_owner_and_refused_to_another(backend: Backend) -> None:
    first = await backend.connected()
    second = await backend.connected() if backend.shared else first
    assert await first.hold("session:s1", "listener A", TTL)
    assert not await second.hold("session:s1", "listener B", TTL)
    assert await second.hold("session:s2", "listener B", TTL)  # another lease


async def test_a_lease_is_renewed_by_its_owner(backend: Backend) -> None:
    backplane = await backend.connected()
    assert await backplane.hold("session:s1", "listener A", 0.3)
    assert await backplane.hold("session:s1", "listener A", TTL)  # renewed: now for 30 s
    await asyncio.sleep(0.5)
    assert not await backplane.hold("session:s1", "listener B", TTL)


async def test_a_lease_let_go_is_free_and_only_its_owner_lets_it_go(backend: Backend) -> None:
    first = await backend.connected()
    second = await backend.connected() if backend.shared else first
    assert await first.hold("session:s1", "listener A", TTL)
    await first.let_go("session:s1", "listener B")  # not its owner: nothing changes
    await first.let_go("session:never held", "listener A")
    assert not await second.hold("session:s1", "listener B", TTL)
    await first.let_go("session:s1", "listener A")
    assert await second.hold("session:s1", "listener B", TTL)


async def test_a_hold_not_renewed_ends_after_its_ttl(backend: Backend) -> None:
    """An instance that died holds nothing for long: its holds end with their ttl."""
    first = await backend.connected()
    second = await backend.connected() if backend.shared else first
    assert await first.hold("session:s1", "listener A", 0.3)
    assert not await second.hold("session:s1", "listener B", TTL)
    await asyncio.sleep(0.5)
    assert await second.hold("session:s1", "listener B", TTL)


async def test_a_lease_is_refused_before_connect_and_after_disconnect(backend: Backend) -> None:
    backplane = backend.new()
    with pytest.raises(BackplaneUnavailable):
        await backplane.hold("session:s1", "listener A", TTL)
    await backplane.connect()
    assert await backplane.hold("session:s1", "listener A", TTL)
    await backplane.disconnect()
    with pytest.raises(BackplaneUnavailable):
        await backplane.hold("session:s1", "listener A", TTL)


async def test_a_lease_one_instance_holds_is_its_owner_s_on_every_instance(
    shared_backend: Backend,
) -> None:
    first, second = await shared_backend.connected(), await shared_backend.connected()
    assert await first.hold("session:s1", "listener A", TTL)
    assert not await second.hold("session:s1", "listener B", TTL)
    assert await second.hold("session:s1", "listener A", TTL)  # the owner, on another instance


async def test_a_lease_stays_held_while_any_instance_holds_it(shared_backend: Backend) -> None:
    first, second, third = [await shared_backend.connected() for _ in range(3)]
    assert await first.hold("session:s1", "listener A", TTL)
    assert await second.hold("session:s1", "listener A", TTL)
    await first.let_go("session:s1", "listener A")
    assert not await third.hold("session:s1", "listener B", TTL)  # the second still holds it
    await second.let_go("session:s1", "listener A")
    assert await third.hold("session:s1", "listener B", TTL)


async def test_the_hold_of_an_instance_that_stopped_renewing_ends_alone(
    shared_backend: Backend,
) -> None:
    first, second, third = [await shared_backend.connected() for _ in range(3)]
    assert await first.hold("session:s1", "listener A", 0.3)  # then never renewed: dead
    assert await second.hold("session:s1", "listener A", TTL)
    await asyncio.sleep(0.5)
    assert not await third.hold("session:s1", "listener B", TTL)  # the second's lasts
    await second.let_go("session:s1", "listener A")
    assert await third.hold("session:s1", "listener B", TTL)


# -- topic histories (clients.md section 14) -------------------------------------------------
# Events kept under a sequence distinct and increasing within their topic, carried by the event
# as "q", read back in order, bounded by count and age; on Redis, across instances and across a
# reconnect (the history lives in Redis, not in the instance).

CHAT = Retention("/chat/room1", max_count=1_000, max_age=3_600)


def event(n: int | str) -> bytes:
    return json.dumps({"m": "v1", "n": f"/chat/{n}"}).encode()


async def test_kept_events_get_sequences_from_1_in_their_topic(backend: Backend) -> None:
    backplane = await backend.connected()
    other = Retention("/chat/room2", 1_000, 3_600)
    published = await backplane.publish_retained(
        [(event(1), CHAT), (event(2), other), (event(3), None), (event(4), CHAT)]
    )
    assert [sequence for _, sequence in published] == [1, 1, None, 2]
    positions = [position for position, _ in published]
    assert positions == sorted(positions, key=lambda p: backplane.parse_position(p) or ())


async def test_the_event_carries_its_sequence_in_the_stream_and_the_history(
    backend: Backend,
) -> None:
    backplane = await backend.connected()
    await backplane.publish_retained([(event(1), CHAT), (event(2), None)])
    delivered = await take(backplane, 2)
    assert json.loads(delivered[0]) == {"q": 1, "m": "v1", "n": "/chat/1"}
    assert json.loads(delivered[1]) == {"m": "v1", "n": "/chat/2"}
    [stored] = await backplane.topic_read(CHAT.topic, 1, 10)
    assert (stored.sequence, stored.data) == (1, delivered[0])
    [entry] = await backplane.publish_retained([(event(3), CHAT)])
    [second] = await backplane.topic_read(CHAT.topic, 2, 10)
    assert second.position == entry[0]  # where the event is among all events
    assert abs(stored.time - time.time()) < 5


async def test_a_history_reads_in_order_from_a_sequence(backend: Backend) -> None:
    backplane = await backend.connected()
    await backplane.publish_retained([(event(n), CHAT) for n in range(50)])
    assert await backplane.topic_bounds(CHAT.topic) == (1, 50)
    read = await backplane.topic_read(CHAT.topic, 42, 5)
    assert [stored.sequence for stored in read] == [42, 43, 44, 45, 46]
    assert [json.loads(s.data)["n"] for s in read] == [f"/chat/{n}" for n in range(41, 46)]
    assert [s.sequence for s in await backplane.topic_read(CHAT.topic, 48, 10)] == [48, 49, 50]
    assert await backplane.topic_read(CHAT.topic, 51, 10) == []
    assert await backplane.topic_read(CHAT.topic, 1, 0) == []


async def test_an_unknown_topic_has_no_history(backend: Backend) -> None:
    backplane = await backend.connected()
    assert await backplane.topic_bounds("/nothing/here") is None
    assert await backplane.topic_read("/nothing/here", 1, 10) == []


async def test_a_topic_past_max_count_keeps_its_newest(backend: Backend) -> None:
    backplane = await backend.connected()
    small = Retention("/chat/small", max_count=10, max_age=3_600)
    await backplane.publish_retained([(event(n), small) for n in range(25)])
    assert await backplane.topic_bounds(small.topic) == (16, 25)
    kept = await backplane.topic_read(small.topic, 1, 100)
    assert [s.sequence for s in kept] == list(range(16, 26))


async def test_a_topic_past_max_age_is_trimmed_as_it_grows(backend: Backend) -> None:
    backplane = await backend.connected()
    short = Retention("/chat/short", max_count=1_000, max_age=0.2)
    await backplane.publish_retained([(event(n), short) for n in range(5)])
    await asyncio.sleep(0.4)
    await backplane.publish_retained([(event(n), short) for n in range(5, 40)])
    first, last = await backplane.topic_bounds(short.topic) or (0, 0)
    assert last == 40
    assert first > 5  # the five old ones are gone (readers also skip what is past max age)


async def test_concurrent_instances_get_distinct_increasing_sequences_in_stream_order(
    shared_backend: Backend,
) -> None:
    first, second = await shared_backend.connected(), await shared_backend.connected()

    async def publish_all(backplane: Backplane, tag: str) -> list[int | None]:
        sequences: list[int | None] = []
        for n in range(100):
            [(_, sequence)] = await backplane.publish_retained([(event(f"{tag}{n}"), CHAT)])
            sequences.append(sequence)
        return sequences

    a, b = await asyncio.gather(publish_all(first, "a"), publish_all(second, "b"))
    assert sorted(s for s in a + b if s is not None) == list(range(1, 201))
    assert a == sorted(a) and b == sorted(b)
    delivered = [json.loads(data)["q"] for data in await take(first, 200)]
    assert delivered == list(range(1, 201))  # the stream's order is the sequences' order


async def test_the_history_outlives_the_instance_that_wrote_it(shared_backend: Backend) -> None:
    writer = await shared_backend.connected()
    await writer.publish_retained([(event(n), CHAT) for n in range(3)])
    await writer.disconnect()
    later = await shared_backend.connected()
    assert await later.topic_bounds(CHAT.topic) == (1, 3)
    [(_, sequence)] = await later.publish_retained([(event(3), CHAT)])
    assert sequence == 4


async def test_publish_retained_before_connect_is_refused(backend: Backend) -> None:
    with pytest.raises(BackplaneUnavailable):
        await backend.new().publish_retained([(event(1), CHAT)])


# -- idempotency claims (contract section 16) ------------------------------------------------


def claim(key: str = "k1", fingerprint: str = "f1", window: float = 60.0) -> Claim:
    return Claim(key, fingerprint, window, "1id-" + key)


async def test_a_claimed_publish_appends_once_and_a_repeat_gets_what_it_kept(
    backend: Backend,
) -> None:
    backplane = await backend.connected()
    [position] = await backplane.publish_many([b"first"], claim())
    with pytest.raises(AlreadyAccepted) as taken:
        await backplane.publish_many([b"again"], claim())
    assert (taken.value.fingerprint, taken.value.position) == ("f1", position)
    assert taken.value.answer == "1id-k1"
    await backplane.publish(b"after")
    assert await take(backplane, 2) == [b"first", b"after"]  # "again" was never appended


async def test_a_repeat_with_another_fingerprint_gets_the_first_one_s(backend: Backend) -> None:
    backplane = await backend.connected()
    await backplane.publish_many([b"first"], claim(fingerprint="f1"))
    with pytest.raises(AlreadyAccepted) as taken:
        await backplane.publish_many([b"other"], claim(fingerprint="f2"))
    assert taken.value.fingerprint == "f1"


async def test_a_claim_covers_a_whole_batch_and_keeps_its_last_position(
    backend: Backend,
) -> None:
    backplane = await backend.connected()
    positions = await backplane.publish_many(numbered(3), claim())
    with pytest.raises(AlreadyAccepted) as taken:
        await backplane.publish_many(numbered(3), claim())
    assert taken.value.position == positions[-1]
    assert await take(backplane, 3) == numbered(3)


async def test_other_keys_and_unclaimed_publishes_are_not_held_back(backend: Backend) -> None:
    backplane = await backend.connected()
    await backplane.publish_many([b"a"], claim("k1"))
    await backplane.publish_many([b"b"], claim("k2"))
    await backplane.publish_many([b"c"])
    assert await take(backplane, 3) == [b"a", b"b", b"c"]


async def test_a_key_is_free_again_after_its_window(backend: Backend) -> None:
    backplane = await backend.connected()
    await backplane.publish_many([b"first"], claim(window=0.2))
    await asyncio.sleep(0.3)
    await backplane.publish_many([b"second"], claim(window=0.2))
    assert await take(backplane, 2) == [b"first", b"second"]


async def test_a_retained_publish_takes_a_claim_too(backend: Backend) -> None:
    backplane = await backend.connected()
    kept = Retention("/chat/claimed", 10, 60.0)
    [(position, sequence)] = await backplane.publish_retained([(b'{"n":1}', kept)], claim())
    with pytest.raises(AlreadyAccepted) as taken:
        await backplane.publish_retained([(b'{"n":1}', kept)], claim())
    assert taken.value.position == position and sequence == 1
    assert await backplane.topic_bounds("/chat/claimed") == (1, 1)  # kept once


async def test_a_key_taken_on_one_instance_is_taken_on_every_instance(
    shared_backend: Backend,
) -> None:
    first, second = await shared_backend.connected(), await shared_backend.connected()
    [position] = await first.publish_many([b"once"], claim())
    with pytest.raises(AlreadyAccepted) as taken:
        await second.publish_many([b"once"], claim())
    assert taken.value.position == position


async def test_concurrent_claims_of_one_key_append_once(shared_backend: Backend) -> None:
    instances = [await shared_backend.connected() for _ in range(3)]
    results = await asyncio.gather(
        *(instance.publish_many([b"race"], claim()) for instance in instances),
        return_exceptions=True,
    )
    assert sum(isinstance(result, list) for result in results) == 1, results
    assert sum(isinstance(result, AlreadyAccepted) for result in results) == 2, results


async def test_claimed_publishes_written_together_each_append_once(backend: Backend) -> None:
    """Concurrent keyed publishes of one instance go to Redis in one script call: a taken key
    skips its own events only. Guards against a batch of claims appending a repeat, or holding
    back the others."""
    backplane = await backend.connected()
    await backplane.publish_many([b"first"], claim("k0"))
    results = await asyncio.gather(
        backplane.publish_many([b"again"], claim("k0")),
        backplane.publish_many([b"b1", b"b2"], claim("k1")),
        backplane.publish_many([b"plain"]),
        backplane.publish_retained(
            [(b'{"n":3}', Retention("/chat/batched", 10, 60.0))], claim("k2")
        ),
        return_exceptions=True,
    )
    assert isinstance(results[0], AlreadyAccepted), results
    assert all(isinstance(result, list) for result in results[1:]), results
    assert await take(backplane, 5) == [b"first", b"b1", b"b2", b"plain", b'{"q":1,"n":3}']
    with pytest.raises(AlreadyAccepted):
        await backplane.publish_many([b"b1"], claim("k1"))


# -- receipts (feedback.md section 17) ---------------------------------------------------------


async def test_an_instances_report_replaces_its_last_and_is_read_back(backend: Backend) -> None:
    backplane = await backend.connected()
    until = time.time() + 60
    await backplane.report([Report("m1", b'{"d":1}', until), Report("m2", b'{"d":7}', until)])
    await backplane.report([Report("m1", b'{"d":2}', until)])
    reports, live = await backplane.reports("m1")
    assert list(reports.values()) == [b'{"d":2}']
    assert set(reports) <= live  # the reporting instance is live
    assert (await backplane.reports("m2"))[0] != {}
    assert (await backplane.reports("unknown"))[0] == {}


async def test_a_report_is_gone_after_its_until(backend: Backend) -> None:
    backplane = await backend.connected()
    await backplane.report([Report("short", b"{}", time.time() + 0.3)])
    assert (await backplane.reports("short"))[0] != {}
    await asyncio.sleep(0.5)
    assert (await backplane.reports("short"))[0] == {}


async def test_every_instance_reports_apart(shared_backend: Backend) -> None:
    first, second = await shared_backend.connected(), await shared_backend.connected()
    until = time.time() + 60
    await first.report([Report("both", b'{"i":1}', until)])
    await second.report([Report("both", b'{"i":2}', until)])
    reports, live = await first.reports("both")
    assert sorted(reports.values()) == [b'{"i":1}', b'{"i":2}']
    assert set(reports) <= live
