"""Losing nothing on a Redis blip: two instances of one gateway, a steady stream of messages
POSTed to both, while Redis loses its connections and then stops for a moment."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio

from bow_gateway import Bow

from .support import AUTH, PATH, Listener, base_config, standard_bow, token, until
from .support.redis_faults import END, Publisher, until_ends
from .support.redis_server import RedisServer

KILLS = 4


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture
async def admin(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis(port=redis_server.port)
    yield client
    await client.aclose()


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    # Thousands of refused POSTs and socket lines: keep what tells the story of the outage.
    caplog.set_level(logging.WARNING, logger="bow_gateway")
    caplog.set_level(logging.INFO, logger="bow_gateway.backplanes.redis")


async def test_no_accepted_message_is_lost_or_repeated_through_redis_faults(
    redis_server: RedisServer,
    admin: redis.asyncio.Redis,
    start_bow: Callable[[Bow], Awaitable[Bow]],
    http: aiohttp.ClientSession,
) -> None:
    config = base_config(
        redis=redis_server.url,
        namespace=f"faults-{uuid.uuid4().hex[:8]}",
        backplane={"publish_timeout": 0.5},
    )
    instances = [await start_bow(standard_bow(config)) for _ in range(2)]
    urls = [f"http://127.0.0.1:{instance.port}" for instance in instances]

    made: list[Listener] = []

    async def listen(url: str, listener_id: str, criteria: dict[str, Any]) -> Listener:
        listener = Listener(url)
        made.append(listener)
        await listener.connect()
        assert await listener.authenticate(token(listener_id, criteria)) is None
        return listener

    stop = asyncio.Event()
    publishers = [
        Publisher(name, url, [{"role": "fan"}]) for name, url in zip("AB", urls, strict=True)
    ]
    tasks: list[asyncio.Task[None]] = []
    try:
        # On each instance: two matching sockets (one of them of an id that has a socket on the
        # other instance too), and one that matches nothing.
        matching = [
            await listen(urls[0], "FAN/both", {"role": "fan"}),
            await listen(urls[0], "FAN/a", {"role": "fan"}),
            await listen(urls[1], "FAN/both", {"role": "fan"}),
            await listen(urls[1], "FAN/b", {"role": "fan"}),
        ]
        others = [
            await listen(urls[0], "OTHER/a", {"role": "other"}),
            await listen(urls[1], "OTHER/b", {"role": "other"}),
        ]
        tasks = [asyncio.create_task(publisher.run(http, stop)) for publisher in publishers]

        async def more_accepted(count: int, timeout: float, what: str) -> None:
            targets = [publisher.accepted() + count for publisher in publishers]
            await until(
                lambda: all(p.accepted() >= t for p, t in zip(publishers, targets, strict=True)),
                f"{count} more messages accepted by each instance {what}",
                timeout=timeout,
            )

        await more_accepted(20, 5, "at first")

        # (a) Redis drops every connection of the gateways, again and again.
        for kill in range(KILLS):
            killed = await admin.client_kill_filter(_type="normal", skipme=True)
            assert killed >= 2, "each instance holds connections to Redis"
            await more_accepted(15, 5, f"after CLIENT KILL #{kill + 1}")

        # (b) Redis stops for a moment, then restarts from its append-only file.
        await asyncio.to_thread(redis_server.stop)
        down = time.monotonic()
        await asyncio.sleep(1.5)
        up = time.monotonic()
        await asyncio.to_thread(redis_server.start)
        await more_accepted(30, 10, "after Redis restarted")
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        for task in tasks:
            task.result()  # a POST that failed outright (no HTTP answer) fails the test
        for publisher in publishers:  # the end markers, after every tick
            response = await http.post(
                publisher.url + PATH,
                json={"name": END, "audience": [{"role": "fan"}, {"role": "other"}]},
                headers=AUTH,
            )
            response.release()
            assert response.status == 204
        received = await asyncio.gather(*(until_ends(listener, 2) for listener in matching))
        unmatched = await asyncio.gather(*(until_ends(listener, 2) for listener in others))
    finally:
        await asyncio.gather(*(listener.close() for listener in made))

    for publisher in publishers:
        statuses = {post.status for post in publisher.posts}
        assert statuses <= {204, 503}, f"{publisher.name}: statuses {statuses}"
        refused = [post for post in publisher.posts if post.status == 503]
        for post in refused:
            assert post.retry_after is not None and int(post.retry_after) >= 1, post
        # Nothing is accepted while Redis is down.
        during = [post for post in publisher.posts if down < post.started and post.ended < up]
        assert during, "POSTs went on while Redis was down"
        assert all(post.status == 503 for post in during), "a POST got 204 while Redis was down"
        # Delivery resumed: messages were accepted (and, below, delivered) after the restart.
        assert sum(post.status == 204 for post in publisher.posts if post.started > up) >= 30

    for number, events in enumerate(received):
        ticks = [body for name, body in events if name == "tick"]
        for publisher in publishers:
            got = [body["n"] for body in ticks if body["src"] == publisher.name]
            accepted = {post.n for post in publisher.posts if post.status == 204}
            missing = sorted(accepted - set(got))
            assert not missing, f"socket {number} lost {publisher.name}'s messages {missing}"
            assert len(got) == len(set(got)), (
                f"socket {number} got a message of {publisher.name} twice"
            )
            assert got == sorted(got), f"socket {number}: {publisher.name}'s messages out of order"
            # A POST answered 503 may still have reached Redis, when its answer was what got lost
            # (see backplanes/redis.py): then it is delivered, once, in order, like the rest.
            # That takes a fault with the XADD under way: one per publisher and fault at most.
            extra = set(got) - accepted
            assert len(extra) <= KILLS + 1, f"socket {number}: 503s delivered: {sorted(extra)}"
        assert len(ticks) == len(events), (
            f"socket {number}: {[e for e in events if e[0] != 'tick']}"
        )
    # One stream, one order: every matching socket, on either instance, sees the same sequence.
    for number, events in enumerate(received[1:], start=1):
        assert events == received[0], f"sockets 0 and {number} received different sequences"
    assert unmatched == [[], []], "the sockets that match no message got something"
