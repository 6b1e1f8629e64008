"""Every protocol across two instances (``clients.md`` sections 11-13): two gateways through one
private redis-server, a Flywheel connection on one, an SSE stream on the other and Socket.IO
sockets on each. Messages pushed to either instance reach them all in one order; a Flywheel
publish on one instance reaches every protocol on the other, a refused one only its publisher;
a ``$remote/{sessionId}/rx/...`` message reaches its session wherever it was pushed; a kick
posted to one instance closes a Flywheel connection on the other.

Real gateways on free ports, a private ``redis-server`` (never the shared one), real clients:
python-socketio, aiohttp's client reading the SSE stream, and the Flywheel client written from
the seed alone.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow

from .support import AUTH, base_config
from .support.mixed_clients import (
    EQ,
    FX,
    TO_EQ,
    TO_FX,
    Mixed,
    Seen,
    mixed_bow,
    next_seen,
    seen_until,
    without_positions,
)
from .support.protocol2 import stream_key
from .support.redis_server import RedisServer

Pair = tuple[Mixed, Mixed]


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
async def pair(
    redis_server: RedisServer,
    start_bow: Callable[[Bow], Awaitable[Bow]],
    http: aiohttp.ClientSession,
) -> AsyncIterator[Pair]:
    """Two instances, A and B, of one gateway (:func:`mixed_bow`) through the private Redis."""
    config = base_config(
        redis=redis_server.url,
        namespace=f"mixed-{uuid.uuid4().hex[:8]}",
        recovery={"position_interval": 3600},  # no __position in what is compared
    )
    a = Mixed("A", await start_bow(mixed_bow(config)), http)
    b = Mixed("B", await start_bow(mixed_bow(config)), http)
    yield a, b
    await asyncio.gather(a.close(), b.close())


async def test_every_protocol_on_either_instance_receives_the_same_messages_in_one_order(
    pair: Pair,
) -> None:
    a, b = pair
    flywheel = await a.flywheel("FLY", FX, subscribe=["quotes/#"])
    on_a = await a.socketio("SIO-A", FX)
    stream = await b.sse("SSE", FX)
    on_b = await b.socketio("SIO-B", FX)
    old_on_b = await b.socketio("OLD-B", FX, proto=None)

    count = 60
    positions: list[str] = [""] * count
    lanes = asyncio.Semaphore(8)

    async def push(i: int) -> None:  # to either instance, several at a time
        async with lanes:
            audience = TO_EQ if i % 5 == 4 else TO_FX  # some for nobody here
            body = {"name": f"quotes/{i}", "payload": {"i": i}, "audience": audience}
            positions[i] = await (a, b)[i % 2].push(body)

    await asyncio.gather(*(push(i) for i in range(count)))
    await b.push({"name": "quotes/end", "audience": TO_FX})

    order = sorted(range(count), key=lambda i: stream_key(positions[i]))
    expected: list[Seen] = [(f"quotes/{i}", {"i": i}, positions[i]) for i in order if i % 5 != 4]
    assert len(expected) == 48
    assert await seen_until(on_a, "quotes/end") == expected
    assert await seen_until(on_b, "quotes/end") == expected
    assert await seen_until(stream, "quotes/end") == expected
    names = without_positions(expected)
    assert without_positions(await seen_until(flywheel, "quotes/end")) == names
    assert without_positions(await seen_until(old_on_b, "quotes/end")) == names


async def test_a_flywheel_publish_on_one_instance_reaches_every_protocol_on_the_other(
    pair: Pair,
) -> None:
    a, b = pair
    publisher = await a.flywheel("T1", FX, subscribe=["quotes/#"])
    stream = await b.sse("SSE", FX, ["quotes/#"])
    socketio = await b.socketio("SIO", FX)
    flywheel = await b.flywheel("T2", FX, subscribe=["quotes/+"])
    other_desk = await b.socketio("EQ", EQ)  # the hook's audience is the publisher's desk

    for n in range(5):
        await publisher.publish(f"quotes/Q{n}", json.dumps({"bid": n}))
    await publisher.publish("quotes/end", "{}")  # a connection's frames are taken in order

    published = [(f"quotes/Q{n}", {"bid": n}) for n in range(5)]
    on_socketio = await seen_until(socketio, "quotes/end")
    assert without_positions(on_socketio) == published
    assert await seen_until(stream, "quotes/end") == on_socketio  # the same positions
    assert without_positions(await seen_until(flywheel, "quotes/end")) == published
    assert without_positions(await seen_until(publisher, "quotes/end")) == published
    # positioned after every publish (they were all delivered above): the other desk's next
    await a.push({"name": "quotes/end", "audience": TO_EQ})
    assert await seen_until(other_desk, "quotes/end") == []


async def test_a_refused_publish_is_told_only_to_its_connection(pair: Pair) -> None:
    a, b = pair
    publisher = await a.flywheel("T1", FX, subscribe=["quotes/#"], session="s-1")
    # a session is its listener's: the same id's other connections may share it (issue 27)
    same_session_a = await a.flywheel("T1", FX, subscribe=["quotes/#"], session="s-1")
    same_session_b = await b.flywheel("T1", FX, subscribe=["quotes/#"], session="s-1")
    stream = await b.sse("SSE", FX)
    socketio = await b.socketio("SIO", FX)

    await publisher.publish("news/x", '{"bid": 1}')  # the hook takes quotes only
    topic, body = await publisher.receive()
    assert topic == "$remote/s-1/rx/errors"
    [error] = json.loads(body)
    assert (error["type"], error["topic"]) == ("TopicAccess", "news/x")
    assert "no publishing on news/x" in error["description"]

    await b.push({"name": "quotes/end", "payload": 0, "audience": TO_FX})
    for client in (publisher, same_session_a, same_session_b, stream, socketio):
        assert (await next_seen(client))[:2] == ("quotes/end", 0)


async def test_a_remote_message_pushed_to_one_instance_reaches_only_its_session_on_the_other(
    pair: Pair,
) -> None:
    a, b = pair
    mine = await a.flywheel("T1", FX, subscribe=["quotes/end"], session="s-1")
    theirs_a = await a.flywheel("T2", FX, subscribe=["#"], session="s-2")
    theirs_b = await b.flywheel("T2", FX, subscribe=["#"], session="s-2")  # its own, on B too
    anonymous_session = await b.flywheel("T4", FX, subscribe=["#"])
    stream = await b.sse("SSE", FX)
    socketio = await b.socketio("SIO", FX)
    old = await a.socketio("OLD", FX, proto=None)

    await b.push({"name": "$remote/s-1/rx/x", "payload": {"for": "s-1"}, "audience": TO_FX})
    await b.push({"name": "quotes/end", "payload": 0, "audience": TO_FX})

    assert (await next_seen(mine))[:2] == ("$remote/s-1/rx/x", {"for": "s-1"})
    for client in (mine, theirs_a, theirs_b, anonymous_session, stream, socketio, old):
        assert (await next_seen(client))[:2] == ("quotes/end", 0)


async def test_a_kick_posted_to_one_instance_closes_a_flywheel_connection_on_the_other_with_4005(
    pair: Pair,
) -> None:
    a, b = pair
    kicked = await a.flywheel("T1", FX, subscribe=["quotes/#"])
    bystander = await a.flywheel("T2", FX, subscribe=["quotes/#"])
    body: dict[str, Any] = {"ids": ["T1"], "reason": "account closed"}
    async with b.http.post(b.url + "/_bow/disconnect", json=body, headers=AUTH) as response:
        assert response.status == 204, await response.text()

    assert await kicked.closed() == (4005, "account closed")
    await b.push({"name": "quotes/end", "payload": 0, "audience": TO_FX})
    assert (await next_seen(bystander))[:2] == ("quotes/end", 0)
