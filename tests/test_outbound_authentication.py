"""The Socket.IO outbound, end to end: authentication, and its timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow

from .support import (
    WAIT,
    Gateway,
    base_config,
    gone_within,
    happens,
    metric,
    plugin_bow,
    raw_websocket_listener,
    refused_alone,
    standard_bow,
    token,
)

# -- authentication ---------------------------------------------------------------------------


async def test_authenticate_with_valid_token_calls_the_acknowledgement(gateway: Gateway) -> None:
    client = await gateway.connect()
    called: list[tuple[Any, ...]] = []
    acked = asyncio.Event()

    def ack(*args: Any) -> None:
        called.append(args)
        acked.set()

    await client.client.emit("authenticate", (token("USER/1"),), callback=ack)
    await asyncio.wait_for(acked.wait(), WAIT)
    assert called == [()]
    assert client.client.connected


async def test_authenticate_with_call_returns(gateway: Gateway) -> None:
    client = await gateway.connect()
    assert await client.authenticate(token("USER/1")) is None
    await gateway.sentinel([{"__id": "USER/1"}], client)


async def test_nothing_is_delivered_before_authenticating(gateway: Gateway) -> None:
    other = await gateway.jwt_listener("USER/2", {"role": "admin"})
    client = await gateway.connect()
    # Matches what the socket will be: its id and its every criterion.
    everything = [{"__id": "USER/1"}, {"role": "admin"}]
    await gateway.push({"name": "before", "audience": everything})
    await other.expect("before")  # the message has been delivered by now
    await client.authenticate_with_ack(token("USER/1", {"role": "admin"}))
    await gateway.push({"name": "after", "audience": everything})
    assert await client.expect("after")
    assert client.log == ["after"]


async def test_second_authenticate_is_ignored(gateway: Gateway) -> None:
    client = await gateway.jwt_listener("USER/1", {"room": "a"})
    acked = asyncio.Event()
    await client.client.emit(
        "authenticate", (token("USER/2", {"room": "b"}),), callback=lambda *_: acked.set()
    )
    assert not await happens(acked)  # no second acknowledgement
    # Neither the new id nor the new criteria reach it; its first ones still do.
    await gateway.push({"name": "as-user-2", "audience": [{"__id": "USER/2"}, {"room": "b"}]})
    await gateway.sentinel([{"__id": "USER/1", "room": "a"}], client)
    assert not acked.is_set()
    assert client.client.connected
    assert client.alerts == []


async def test_second_authenticate_with_a_bad_token_is_ignored_too(gateway: Gateway) -> None:
    client = await gateway.jwt_listener("USER/1")
    await client.client.emit("authenticate", ("garbage",), callback=lambda *_: None)
    assert not await happens(client.disconnected)
    await gateway.sentinel([{"__id": "USER/1"}], client)
    assert client.client.connected and client.alerts == []


async def test_coroutine_listener_fn_and_criteria_fn_work(
    serve: Callable[[Bow], Awaitable[Gateway]],
) -> None:
    async def listener_fn(listener_token: Any) -> Any:
        await asyncio.sleep(0.01)
        return {"id": listener_token}

    async def criteria_fn(details: Any) -> Any:
        await asyncio.sleep(0.01)
        return {"room": f"room-of-{details['id']}"}

    gateway = await serve(plugin_bow(listener_fn, criteria_fn))
    client = await gateway.listener("USER/1")
    await gateway.sentinel([{"room": "room-of-USER/1"}], client)


async def test_plain_listener_fn_and_criteria_fn_work(
    serve: Callable[[Bow], Awaitable[Gateway]],
) -> None:
    gateway = await serve(
        plugin_bow(lambda t: {"id": t}, lambda details: {"room": f"room-of-{details['id']}"})
    )
    client = await gateway.listener("USER/1")
    await gateway.sentinel([{"room": "room-of-USER/1"}], client)


async def test_numeric_listener_id_is_matched_as_a_number(
    serve: Callable[[Bow], Awaitable[Gateway]],
) -> None:
    gateway = await serve(plugin_bow(lambda t: {"id": 7}, lambda details: {}))
    client = await gateway.listener("anything")
    await gateway.push({"name": "as-string", "audience": [{"__id": "7"}]})
    await gateway.push({"name": "as-true", "audience": [{"__id": True}]})
    await gateway.sentinel([{"__id": 7.0}], client)


# -- the authentication timeout ---------------------------------------------------------------


async def test_socket_that_never_authenticates_gets_alert_then_disconnect(
    serve: Callable[[Bow], Awaitable[Gateway]],
) -> None:
    gateway = await serve(standard_bow(base_config(outbound={"timeout": 0.5})))
    started = time.monotonic()
    victim = await gateway.connect()
    bystander = await gateway.jwt_listener("USER/1")
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "USER/1"}])
    elapsed = time.monotonic() - started
    assert 0.4 <= elapsed < 3, elapsed
    assert "authenticated" in alert and "0.5" in alert, alert
    # The authenticated socket outlives the timeout.
    await asyncio.sleep(0.6)
    await gateway.sentinel([{"__id": "USER/1"}], bystander)


@pytest.mark.parametrize(
    ("query", "sends"),
    [
        ("v=1.3", []),  # Engine.IO only: never a Socket.IO connect
        ("v=1.3", ["40"]),  # connected, never authenticated
        ("", ["40"]),  # a connect refused for a missing ?v=
        ("v=1.3", ["40/admin,"]),  # a connect to a namespace refused
    ],
    ids=["engine-io-only", "connected", "refused-version", "refused-namespace"],
)
async def test_a_connection_never_authenticated_is_closed_after_the_timeout_and_counted(
    serve: Callable[[Bow], Awaitable[Gateway]],
    http: aiohttp.ClientSession,
    query: str,
    sends: list[str],
) -> None:
    # Regression: all but a connected socket stayed open indefinitely, uncounted.
    gateway = await serve(standard_bow(base_config(outbound={"timeout": 0.5})))
    ws = await http.ws_connect(gateway.url + f"/socket.io/?EIO=4&transport=websocket&{query}")
    assert (await ws.receive_str(timeout=WAIT)).startswith("0{")
    for packet in sends:
        await ws.send_str(packet)
    assert await metric(gateway, "bow_connections_open") == 1
    assert 0.4 <= await gone_within(ws, 3) < 3
    assert await metric(gateway, "bow_connections_open") == 0
    timeouts = await metric(gateway, 'bow_disconnects_total{reason="timeout"}')
    assert timeouts == 1


async def test_a_socket_that_leaves_the_namespace_is_closed_at_once(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    # Regression: "40" then "41" left an Engine.IO connection open, outside every timeout.
    ws = await raw_websocket_listener(http, gateway.url, token("USER/1"))
    await ws.send_str("41")
    assert await gone_within(ws, 1) < 1
    assert await metric(gateway, "bow_connections_open") == 0


@pytest.mark.parametrize("hanging", ["listener_fn", "criteria_fn"])
async def test_hanging_coroutine_user_function_is_bounded_by_the_timeout(
    serve: Callable[[Bow], Awaitable[Gateway]], hanging: str
) -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async def listener_fn(listener_token: Any) -> Any:
        if hanging == "listener_fn" and listener_token == "hang":
            await forever()
        return {"id": listener_token}

    async def criteria_fn(details: Any) -> Any:
        if hanging == "criteria_fn" and details["id"] == "hang":
            await forever()
        return {"room": "lobby"}

    gateway = await serve(plugin_bow(listener_fn, criteria_fn, timeout=0.5))
    bystander = await gateway.listener("good")
    victim = await gateway.connect()
    started = time.monotonic()
    await victim.client.emit("authenticate", ("hang",), callback=lambda *_: None)
    await refused_alone(gateway, victim, bystander, [{"room": "lobby"}])
    assert time.monotonic() - started < 2
    # A newcomer is still served.
    newcomer = await gateway.listener("new")
    await gateway.sentinel([{"__id": "new"}], newcomer)
