"""Topic histories (``clients.md`` section 14) end to end on Socket.IO protocol 2: ``[[history]]``
rules keep messages with a sequence per topic, ``replay`` reads them back filtered by the
socket's criteria of now; through Redis, sequences stay distinct and increasing across two
instances publishing at once and across a restart. Real gateways, real python-socketio clients,
a private redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow

from .support import AUTH, WAIT, Gateway, base_config, token
from .support.protocol2 import P2, P2Gateway, p2_bow
from .support.redis_server import RedisServer

ROOM = "chat/room1"
MEMBERS = [{"room": 1}]
MEMBER = {"room": 1}
HISTORY = [{"filter": "chat/#", "max_count": 100, "max_age": 3600}]

Serve = Callable[..., Awaitable[P2Gateway]]


@pytest.fixture
async def serve(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> AsyncIterator[Serve]:
    gateways: list[P2Gateway] = []

    async def start(**config: Any) -> P2Gateway:
        config.setdefault("history", HISTORY)
        gateway = P2Gateway(Gateway(await start_bow(p2_bow(base_config(**config))), http))
        gateways.append(gateway)
        await gateway.watch()
        return gateway

    yield start
    for gateway in gateways:
        await gateway.close()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


async def replay(client: P2, request: dict[str, Any]) -> tuple[list[tuple[Any, ...]], Any]:
    """Send ``replay``; the events it brought (in order) and the ack's result."""
    acks: asyncio.Queue[Any] = asyncio.Queue()
    await client.client.emit("replay", request, callback=lambda *args: acks.put_nowait(args))
    result = (await asyncio.wait_for(acks.get(), WAIT))[0]
    events = []
    while not client.events.empty():
        name, args = client.events.get_nowait()
        if name != "__position":
            events.append((name, *args))
    return events, result


async def say(gateway: P2Gateway, n: int, audience: list[dict[str, Any]] = MEMBERS) -> str:
    return await gateway.push({"name": ROOM, "payload": {"n": n}, "audience": audience})


async def member(gateway: P2Gateway, listener_id: str = "U1") -> P2:
    client, _ = await gateway.listener(token(listener_id, MEMBER))
    return client


async def test_live_events_of_a_kept_topic_carry_their_sequence(serve: Serve) -> None:
    gateway = await serve()
    client = await member(gateway)
    first, second = await say(gateway, 1), await say(gateway, 2)
    assert await client.expect(ROOM) == ({"n": 1}, {"position": first, "sequence": 1})
    assert await client.expect(ROOM) == ({"n": 2}, {"position": second, "sequence": 2})
    other = await gateway.push({"name": "news", "audience": MEMBERS})
    assert await client.expect("news") == (None, {"position": other})


async def test_replay_the_last_n_then_the_ack_counts_them(serve: Serve) -> None:
    gateway = await serve()
    for n in range(1, 31):
        await say(gateway, n)
    await gateway.settle()
    client = await member(gateway)
    events, result = await replay(client, {"topic": ROOM, "start": -5})
    assert result == {"count": 5}
    assert [(name, payload["n"], meta) for name, payload, meta in events] == [
        (ROOM, n, {"sequence": n, "replayed": True}) for n in range(26, 31)
    ]


async def test_replay_from_a_sequence_with_a_max_count(serve: Serve) -> None:
    gateway = await serve()
    for n in range(1, 31):
        await say(gateway, n)
    await gateway.settle()
    client = await member(gateway)
    events, result = await replay(client, {"topic": ROOM, "start": 12, "max_count": 3})
    assert result == {"count": 3}
    assert [meta["sequence"] for _, _, meta in events] == [12, 13, 14]
    events, result = await replay(client, {"topic": ROOM, "start": 0})
    assert result == {"count": 30}


async def test_replay_shows_only_what_the_criteria_of_now_match(serve: Serve) -> None:
    gateway = await serve()
    for n in range(1, 11):
        await say(gateway, n, MEMBERS if n % 2 else [{"room": 2}])
    await gateway.settle()
    client = await member(gateway, "U1")
    events, result = await replay(client, {"topic": ROOM, "start": 0})
    assert [meta["sequence"] for _, _, meta in events] == [1, 3, 5, 7, 9]
    assert result == {"count": 5}
    await gateway.bow.set_criteria({"id": "U1", "criteria": {"room": 2}})
    await gateway.settle()
    events, _ = await replay(client, {"topic": ROOM, "start": 0})
    assert [meta["sequence"] for _, _, meta in events] == [2, 4, 6, 8, 10]


async def test_a_topic_past_max_count_replays_only_what_is_kept(serve: Serve) -> None:
    gateway = await serve(history=[{"filter": "chat/#", "max_count": 10}])
    for n in range(1, 26):
        await say(gateway, n)
    await gateway.settle()
    client = await member(gateway)
    events, result = await replay(client, {"topic": ROOM, "start": 0})
    assert [meta["sequence"] for _, _, meta in events] == list(range(16, 26))
    assert result == {"count": 10}


async def test_a_topic_past_max_age_replays_only_what_is_kept(serve: Serve) -> None:
    gateway = await serve(history=[{"filter": "chat/#", "max_age": 0.3}])
    for n in range(1, 4):
        await say(gateway, n)
    await asyncio.sleep(0.5)
    for n in range(4, 6):
        await say(gateway, n)
    await gateway.settle()
    client = await member(gateway)
    events, result = await replay(client, {"topic": ROOM, "start": 0})
    assert [meta["sequence"] for _, _, meta in events] == [4, 5]
    assert result == {"count": 2}


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        ({"topic": "news", "start": 0}, "keeps no history"),
        ({"topic": "chat/#", "start": 0}, "not a filter"),
        ({"topic": ROOM, "start": "x"}, "start must be"),
        ({"topic": ROOM, "start": 0, "max_count": -1}, "max_count"),
        ({"topic": ROOM, "from": 0}, "unknown key 'from'"),
        ({"topic": "$remote/a/rx/b"}, "topic must be"),
    ],
)
async def test_a_bad_replay_is_refused_in_its_ack(
    serve: Serve, request_: dict[str, Any], says: str
) -> None:
    gateway = await serve()
    client = await member(gateway)
    _, result = await replay(client, request_)
    assert result["error"]["code"] == 4000 and says in result["error"]["text"], result


async def test_without_history_rules_replay_is_refused(serve: Serve) -> None:
    gateway = await serve(history=[])
    client = await member(gateway)
    _, result = await replay(client, {"topic": ROOM})
    assert "keeps no topic history" in result["error"]["text"]


# -- through Redis ------------------------------------------------------------------------------


async def test_two_instances_publishing_at_once_give_increasing_sequences(
    serve: Serve, redis_server: RedisServer, http: aiohttp.ClientSession
) -> None:
    namespace = "history-two"
    first = await serve(redis=redis_server.url, namespace=namespace)
    second = await serve(redis=redis_server.url, namespace=namespace)
    client = await member(first)

    async def publish(gateway: P2Gateway, tag: str) -> None:
        for n in range(50):
            body = {"name": ROOM, "payload": {"tag": tag, "n": n}, "audience": MEMBERS}
            async with http.post(gateway.url + "/v1.2/messages", json=body, headers=AUTH) as r:
                assert r.status == 204

    await asyncio.gather(publish(first, "a"), publish(second, "b"))
    live = [(await client.expect(ROOM))[1]["sequence"] for _ in range(100)]
    assert live == list(range(1, 101))  # strictly increasing, as delivered
    events, _ = await replay(client, {"topic": ROOM, "start": 0})
    assert [meta["sequence"] for _, _, meta in events] == list(range(1, 101))
    for tag in "ab":
        ns = [payload["n"] for _, payload, _ in events if payload["tag"] == tag]
        assert ns == list(range(50))


async def test_sequences_go_on_across_a_gateway_restart(
    start_bow: Callable[[Bow], Awaitable[Bow]],
    redis_server: RedisServer,
    http: aiohttp.ClientSession,
) -> None:
    config = base_config(redis=redis_server.url, namespace="history-restart", history=HISTORY)
    bow = await start_bow(p2_bow(config))
    gateway = P2Gateway(Gateway(bow, http))
    for n in range(1, 4):
        await say(gateway, n)
    await bow.stop()
    again = P2Gateway(Gateway(await start_bow(p2_bow(config)), http))
    client = await member(again)
    await say(again, 4)
    assert (await client.expect(ROOM))[1]["sequence"] == 4
    events, _ = await replay(client, {"topic": ROOM, "start": 0})
    assert [meta["sequence"] for _, _, meta in events] == [1, 2, 3, 4]
    await again.close()


# -- issue 27: replays are rate-limited ---------------------------------------------------


async def test_a_replay_flood_gets_too_many_requests(serve: Serve) -> None:
    gateway = await serve(recovery={"max_replays_per_minute": 4})
    client = await member(gateway)
    await say(gateway, 1)
    await gateway.settle()
    results = []
    for _ in range(6):
        _, result = await replay(client, {"topic": ROOM, "start": 0})
        results.append(result)
    assert results[:4] == [{"count": 1}] * 4
    for result in results[4:]:
        assert result["error"]["code"] == 4011
        assert result["error"]["reason"] == "too_many_requests"
    # the id's bucket: another socket of U1 is refused too; U2 is not
    again = await member(gateway)
    assert (await replay(again, {"topic": ROOM, "start": 0}))[1]["error"]["code"] == 4011
    other = await member(gateway, "U2")
    assert (await replay(other, {"topic": ROOM, "start": 0}))[1] == {"count": 1}
