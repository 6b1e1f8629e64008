"""The webhook store contract, run against both stores: in-process and Redis (a private
redis-server). What only Redis does (the lease, a takeover by another instance) is tested in
test_webhooks_redis.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import orjson
import pytest

from bow_gateway.webhooks.events import WebhookEvent
from bow_gateway.webhooks.store import Finished, WebhookStore, dead_letter, public
from bow_gateway.webhooks.store_memory import MemoryWebhookStore
from bow_gateway.webhooks.store_redis import RedisWebhookStore

from .support.redis_server import RedisServer

Make = Callable[..., WebhookStore]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(params=["memory", "redis"])
async def make(request: pytest.FixtureRequest) -> AsyncIterator[Make]:
    """``make(max_backlog=..., max_dead=...)``: a store; Redis ones share a fresh namespace."""
    made: list[WebhookStore] = []
    namespace = uuid.uuid4().hex

    def build(**bounds: int) -> WebhookStore:
        store: WebhookStore
        if request.param == "memory":
            store = MemoryWebhookStore(**bounds)
        else:
            server = request.getfixturevalue("redis_server")
            store = RedisWebhookStore(server.url, namespace=namespace, **bounds)
        made.append(store)
        return store

    yield build
    for store in made:
        await store.close()


def event(n: int, key: str = "") -> WebhookEvent:
    return WebhookEvent("message.receipt", {"n": n}, key, at=1_700_000_000.0 + n)


def letter(webhook_id: str, n: int = 0) -> bytes:
    return dead_letter(
        webhook_id,
        url="http://127.0.0.1/hook",
        tag="t1",
        event=event(n),
        attempts=3,
        last_status=503,
        last_error="HTTP 503",
    )


async def test_events_are_taken_in_the_order_they_were_appended(make: Make) -> None:
    store = make()
    assert await store.append([event(1), event(2, "k"), event(3)]) == 3
    await store.begin()
    taken = await store.take(10, 0.5)
    assert [entry.event for entry in taken] == [event(1), event(2, "k"), event(3)]
    assert len({entry.id for entry in taken}) == 3
    assert await store.depth() == 3


async def test_a_finished_entry_is_gone_and_is_not_taken_again(make: Make) -> None:
    store = make()
    await store.append([event(1), event(2)])
    await store.begin()
    first, second = await store.take(10, 0.5)
    await store.finish([Finished(first.id, "t1", 1)])
    assert await store.depth() == 1
    await store.begin()  # as after a takeover: what is pending is taken again
    assert [entry.id for entry in await store.take(10, 0.5)] == [second.id]


async def test_an_entry_for_two_webhooks_stays_until_both_are_over_and_tells_who_had_it(
    make: Make,
) -> None:
    store = make()
    await store.append([event(1)])
    await store.begin()
    (entry,) = await store.take(10, 0.5)
    await store.finish([Finished(entry.id, "t1", 2)])
    await store.begin()
    (again,) = await store.take(10, 0.5)
    assert (again.id, again.done) == (entry.id, frozenset({"t1"}))
    await store.finish([Finished(entry.id, "t1", 2), Finished(entry.id, "t2", 2)])
    assert await store.depth() == 0


async def test_take_waits_for_an_event_then_gives_nothing(make: Make) -> None:
    store = make()
    await store.begin()
    assert await store.take(10, 0.2) == []


async def test_past_the_backlog_bound_events_overflow_and_can_be_buried(make: Make) -> None:
    store = make(max_backlog=2)
    assert await store.append([event(1), event(2), event(3)]) == 2
    (overflowed,) = await store.overflowed(10)
    assert overflowed.event == event(3)
    await store.bury([overflowed.id], [letter("msg_x_t1", 3)])
    assert await store.overflowed(10) == []
    assert [public(found)["id"] for found in await store.dead(10)] == ["msg_x_t1"]


async def test_dead_letters_are_listed_oldest_first_and_the_oldest_trimmed(make: Make) -> None:
    store = make(max_dead=3)
    await store.append([event(n) for n in range(5)])
    await store.begin()
    entries = await store.take(10, 0.5)
    for n, entry in enumerate(entries):
        await store.finish([Finished(entry.id, "t1", 1, letter(f"msg_{n}_t1", n))])
    listed = [public(found) for found in await store.dead(10)]
    assert [found["id"] for found in listed] == ["msg_2_t1", "msg_3_t1", "msg_4_t1"]
    assert listed[0]["last_status"] == 503 and listed[0]["attempts"] == 3
    assert [public(found)["id"] for found in await store.dead(2)] == ["msg_2_t1", "msg_3_t1"]


async def test_a_replayed_dead_letter_is_queued_again_with_its_webhook_id_once(
    make: Make,
) -> None:
    store = make()
    await store.append([event(7)])
    await store.begin()
    (entry,) = await store.take(10, 0.5)
    await store.finish([Finished(entry.id, "t1", 1, letter("msg_first_t1", 7))])
    assert await store.replay(["msg_first_t1", "msg_unknown", "msg_first_t1"]) == 1
    assert await store.replay(["msg_first_t1"]) == 0
    assert await store.dead(10) == []
    (replayed,) = await store.take(10, 0.5)
    assert (replayed.event, replayed.tag) == (event(7), "t1")
    assert replayed.webhook_id_for("t1") == "msg_first_t1"


async def test_a_dead_letter_keeps_what_a_replay_needs(make: Make) -> None:
    store = make()
    await store.append([event(1)])
    await store.begin()
    (entry,) = await store.take(10, 0.5)
    await store.finish([Finished(entry.id, "t1", 1, letter("msg_a_t1", 1))])
    (stored,) = await store.dead(1)
    assert orjson.loads(stored)["event"]["data"] == {"n": 1}
    assert set(public(stored)) == {
        "id", "url", "type", "attempts", "last_status", "last_error", "created_at",
    }  # fmt: skip
