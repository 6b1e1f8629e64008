"""A Flywheel ``sessionId`` across instances (``clients.md`` sections 11 and 12): two gateways
through one private redis-server. A sessionId is held by the identity that bound it on every
instance, so that a listener connected to another instance cannot bind it and read the direct
messages (``$remote/{sessionId}/rx/...``) meant for its holder.

Real gateways on free ports, a private ``redis-server`` (never the shared one), the Flywheel client
written from the seed alone.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import aiohttp
import pytest

from bow_gateway import Bow

from .support import Gateway, base_config
from .support.flywheel import QUOTES, bearer, flywheel_bow
from .support.flywheel_client import FlywheelClient
from .support.redis_server import RedisServer

Open = Callable[[Gateway], Awaitable[FlywheelClient]]
HELD = "sessionId is held by another listener: choose another"


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
async def pair(
    redis_server: RedisServer, serve: Callable[[Bow], Awaitable[Gateway]]
) -> tuple[Gateway, Gateway]:
    """Two instances, A and B, of one gateway (anonymous connections allowed)."""
    config = base_config(redis=redis_server.url, namespace=f"fly-{uuid.uuid4().hex[:8]}")
    a = await serve(flywheel_bow(config, anonymous={"public": True}))
    b = await serve(flywheel_bow(config, anonymous={"public": True}))
    return a, b


@pytest.fixture
async def open_on(http: aiohttp.ClientSession) -> AsyncIterator[Open]:
    """``await open_on(gateway)``: a Flywheel connection to that instance (closed at the end)."""
    clients: list[FlywheelClient] = []

    async def open_(gateway: Gateway) -> FlywheelClient:
        client = await FlywheelClient.open(http, gateway.url)
        clients.append(client)
        return client

    yield open_
    for client in clients:
        await client.close()


async def direct_message_then_sentinel(gateway: Gateway, session: str) -> None:
    """Push ``$remote/{session}/rx/dm`` ("secret"), then ``quotes/x`` ("sentinel")."""
    dm = {"name": f"$remote/{session}/rx/dm", "payload": "secret", "audience": QUOTES}
    await gateway.push(dm)
    await gateway.push({"name": "quotes/x", "payload": "sentinel", "audience": QUOTES})


async def test_a_session_bound_on_one_instance_is_refused_to_another_listener_on_the_other(
    pair: tuple[Gateway, Gateway], open_on: Open
) -> None:
    """Guards against a listener binding another's ``sessionId`` through another instance to
    read its direct messages."""
    a, b = pair
    owner = await open_on(a)
    assert (await owner.bind(sessionId="s-1", auth=bearer("T1", {"desk": "fx"})))["errors"] == []
    thief = await open_on(b)
    auth = bearer("T2", {"desk": "fx"})
    response = await thief.bind(sessionId="s-1", auth=auth, subscribe=["quotes/#"])
    assert response["errors"] == [{"type": "General", "description": HELD}]
    for gateway in (b, a):  # pushed to either instance: the thief's, the owner's
        await direct_message_then_sentinel(gateway, "s-1")
        assert await owner.receive() == ("$remote/s-1/rx/dm", "secret")
        assert await thief.receive() == ("quotes/x", "sentinel")


async def test_a_session_is_free_on_every_instance_once_its_listener_s_connections_are_gone(
    pair: tuple[Gateway, Gateway], open_on: Open
) -> None:
    a, b = pair
    first = await open_on(a)
    assert (await first.bind(sessionId="s-1", auth=bearer("T1", {"desk": "fx"})))["errors"] == []
    second = await open_on(b)
    assert (await second.bind(auth=bearer("T2", {"desk": "fx"})))["errors"] == []
    assert (await second.bind(sessionId="s-1"))["errors"] != []
    await first.close()
    deadline = time.monotonic() + 5
    while (await second.bind(sessionId="s-1"))["errors"]:  # once A has seen the close
        assert time.monotonic() < deadline, "the session was never let go"
        await asyncio.sleep(0.1)
    await direct_message_then_sentinel(a, "s-1")
    assert await second.receive() == ("$remote/s-1/rx/dm", "secret")


async def test_an_upgrade_lets_go_of_a_session_anonymous_connections_hold_on_another_instance(
    pair: tuple[Gateway, Gateway], open_on: Open
) -> None:
    """Anonymous connections share a session on every instance; the one that becomes a listener
    leaves it, so that it never shares a session with another identity."""
    a, b = pair
    one, two = await open_on(a), await open_on(b)
    assert (await one.bind(sessionId="s-anon"))["errors"] == []
    assert (await two.bind(sessionId="s-anon"))["errors"] == []
    response = await one.bind(auth=bearer("T1", {"desk": "fx", "public": True}))
    [error] = response["errors"]
    assert error["description"] == "sessionId 's-anon' is held by another listener: let go"
    anyone = [{"public": True}]
    await a.push({"name": "$remote/s-anon/rx/dm", "payload": "anon", "audience": anyone})
    assert await two.receive() == ("$remote/s-anon/rx/dm", "anon")
    assert await one.nothing_within(0.3)


async def test_a_session_id_is_refused_while_the_backplane_cannot_say_who_holds_it(
    pair: tuple[Gateway, Gateway], open_on: Open, redis_server: RedisServer
) -> None:
    """Fails closed: no Redis, no new session; the connection stays open."""
    a, _ = pair
    client = await open_on(a)
    assert (await client.bind(auth=bearer("T1", {"desk": "fx"})))["errors"] == []
    redis_server.stop()
    [error] = (await client.bind(sessionId="s-1"))["errors"]
    assert error["type"] == "General" and "backplane is unavailable" in error["description"]
    assert (await client.bind(subscribe=["quotes/#"]))["errors"] == []  # still served
