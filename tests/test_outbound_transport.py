"""The Socket.IO outbound, end to end: hostile clients, stopping, the direct write path to
websockets (slow sockets, the upgrade, compression) and heartbeats."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import socketio

from bow_gateway import Bow

from .support import (
    WAIT,
    Gateway,
    base_config,
    happens,
    metric,
    raw_websocket_listener,
    refused_alone,
    short_heartbeats,
    standard_bow,
    token,
)

# -- hostile clients ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        '2["not-closed',
        '2{"not":"a list"}',
        "2[]",
        "2[42]",
        '2"authenticate"',
        "4",
        "9",
        "x",
        "",
        '51-["authenticate",{"_placeholder":true,"num":0}]',
        '69999999999-[{"_placeholder":true,"num":0}]',
    ],
    ids=[
        "unterminated-json",
        "event-not-a-list",
        "event-empty-list",
        "event-name-not-a-string",
        "event-a-string",
        "connect-error-from-client",
        "unknown-packet-type",
        "not-a-packet",
        "empty",
        "binary-event",  # regression: attachments were awaited and kept in memory
        "binary-ack",
    ],
)
async def test_malformed_packet_gets_alert_and_disconnects_that_socket_only(
    gateway: Gateway, raw: str
) -> None:
    bystander = await gateway.jwt_listener("USER/1")
    victim = await gateway.jwt_listener("USER/2")
    await victim.client.eio.send(raw)
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "USER/1"}])
    assert "malformed" in alert, alert
    newcomer = await gateway.jwt_listener("USER/3")
    await gateway.sentinel([{"__id": "USER/3"}], newcomer)


async def test_malformed_packet_before_authenticating_gets_alert_and_disconnect(
    gateway: Gateway,
) -> None:
    bystander = await gateway.jwt_listener("USER/1")
    victim = await gateway.connect()
    await victim.client.eio.send('2["authenticate"')
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "USER/1"}])
    assert "malformed" in alert, alert


async def test_other_client_events_are_ignored(gateway: Gateway) -> None:
    client = await gateway.jwt_listener("USER/1")
    answered = asyncio.Event()
    await client.client.emit("something", {"x": 1}, callback=lambda *_: answered.set())
    assert not await happens(answered)
    await gateway.sentinel([{"__id": "USER/1"}], client)
    assert client.client.connected and client.alerts == [] and not answered.is_set()


# -- stopping ---------------------------------------------------------------------------------


async def test_stop_closes_sockets_cleanly_and_returns_promptly(
    http: aiohttp.ClientSession,
) -> None:
    bow = standard_bow()
    await bow.start()
    gateway = Gateway(bow, http)
    stopped = False
    try:
        authenticated = await gateway.jwt_listener("USER/1")
        anonymous = await gateway.connect()
        polling = await gateway.listener(token("USER/2"), transports=["polling"])
        started = time.monotonic()
        await asyncio.wait_for(bow.stop(), WAIT)
        stopped = True
        assert time.monotonic() - started < 2
        for client in (authenticated, anonymous, polling):
            await client.wait_disconnected()
            assert client.log == ["disconnect"], client.log  # no alert: a clean close
        with pytest.raises(socketio.exceptions.ConnectionError):
            await gateway.connect()
    finally:
        await gateway.close()
        if not stopped:
            await bow.stop()


async def test_disconnect_message_to_polling_sockets_does_not_stall_delivery(
    gateway: Gateway,
) -> None:
    other = await gateway.jwt_listener("USER/0", {"role": "author"})
    for round_ in range(3):
        gone = [
            await gateway.listener(token(f"USER/{round_}-{n}", {"role": "admin"}), transports=[t])
            for n, t in enumerate(["websocket", "polling", "websocket", "polling", "websocket"])
        ]
        await gateway.push({"name": "__disconnect", "audience": [{"role": "admin"}]})
        await gateway.sentinel([{"role": "author"}], other)
        for client in gone:
            await client.wait_disconnected()
            assert client.log == ["disconnect"], client.log


# -- the direct write path: slow sockets, the upgrade, compression -----------------------------


async def test_websockets_do_not_negotiate_compression(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    ws = await raw_websocket_listener(http, gateway.url, token("USER/1"))
    try:
        assert ws.compress == 0  # the client offered permessage-deflate; the server declined
        await gateway.push({"name": "plain", "audience": [{"__id": "USER/1"}]})
        assert (
            await ws.receive_str(timeout=WAIT)
            == '42["plain",{"name":"plain","audience":[{"__id":"USER/1"}]}]'
        )
    finally:
        await ws.close()


async def test_a_socket_that_stops_reading_is_dropped_as_too_slow_and_no_other(
    serve: Callable[[Bow], Awaitable[Gateway]], http: aiohttp.ClientSession
) -> None:
    gateway = await serve(
        standard_bow(base_config(outbound={"timeout": 5, "max_buffered_bytes": 65_536}))
    )
    reader = await gateway.jwt_listener("USER/1", {"room": "a"})
    stalled = await raw_websocket_listener(http, gateway.url, token("USER/2", {"room": "a"}))
    try:
        big = "x" * 60_000
        slow = 'bow_disconnects_total{reason="slow"}'
        for seq in range(400):  # ~24 MB: more than the kernel's socket buffers hold
            await gateway.push(
                {"name": "big", "seq": seq, "blob": big, "audience": [{"room": "a"}]}
            )
            assert (await reader.expect("big"))["seq"] == seq
            if seq % 20 == 19 and (await metric(gateway, slow)) == 1:
                break
        else:
            pytest.fail("the socket that stopped reading was never dropped")
        await gateway.sentinel([{"room": "a"}], reader)
        assert reader.client.connected
    finally:
        await stalled.close()


async def test_messages_keep_their_order_across_the_upgrade_to_websocket(
    gateway: Gateway,
) -> None:
    # Regression: frames written straight to a websocket must not overtake those still in
    # engineio's queue from the long-polling phase.
    client = await gateway.listener(token("USER/1"), transports=["polling", "websocket"])
    count = 300
    pushes = [
        gateway.push({"name": "tick", "seq": seq, "audience": [{"__id": "USER/1"}]})
        for seq in range(count)
    ]
    for push in pushes:  # in order: each is accepted before the next is sent
        await push
    received = [(await client.expect("tick"))["seq"] for _ in range(count)]
    assert received == list(range(count))
    for _ in range(250):  # the upgrade runs in the background (on a loaded machine, later)
        if client.client.transport() == "websocket":
            break
        await asyncio.sleep(0.02)
    assert client.client.transport() == "websocket"
    await gateway.sentinel([{"__id": "USER/1"}], client)


# -- heartbeats over the lean websocket transport -----------------------------------------------


async def test_pings_keep_an_idle_websocket_open(gateway: Gateway) -> None:
    short_heartbeats(gateway.bow)
    client = await gateway.jwt_listener("USER/1")
    await asyncio.sleep(3.5)  # three pings, answered by the client
    assert client.client.connected
    await gateway.sentinel([{"__id": "USER/1"}], client)


async def test_a_websocket_that_stops_answering_pings_is_closed_and_no_other(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    short_heartbeats(gateway.bow)
    bystander = await gateway.jwt_listener("USER/1")
    silent = await raw_websocket_listener(http, gateway.url, token("USER/2"))
    try:
        pings = 0
        while True:  # reads (so its buffers never fill) but never answers "2" with "3"
            message = await silent.receive(timeout=WAIT)
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            pings += message.data == "2"
        assert pings >= 1
        # engineio's ping check or the reader's silence timeout, whichever comes first
        timed_out = await metric(gateway, 'bow_disconnects_total{reason="ping timeout"}')
        silent_for = await metric(gateway, 'bow_disconnects_total{reason="transport close"}')
        assert timed_out + silent_for == 1
        assert bystander.client.connected
        await gateway.sentinel([{"__id": "USER/1"}], bystander)
    finally:
        await silent.close()


@pytest.mark.parametrize("garbage", ["", "x"])
async def test_a_frame_that_is_not_engine_io_closes_that_websocket_only(
    gateway: Gateway, http: aiohttp.ClientSession, garbage: str
) -> None:
    bystander = await gateway.jwt_listener("USER/1")
    victim = await raw_websocket_listener(http, gateway.url, token("USER/2"))
    try:
        await victim.send_str(garbage)
        while (await victim.receive(timeout=WAIT)).type == aiohttp.WSMsgType.TEXT:
            pass  # until the server closes it
        assert bystander.client.connected
        await gateway.sentinel([{"__id": "USER/1"}], bystander)
    finally:
        await victim.close()


class _RoomsThatMustNotBeScanned(dict[Any, Any]):
    def _scanned(self, *args: Any) -> Any:
        raise AssertionError("a disconnect went through every room of the namespace")

    copy = items = keys = values = __iter__ = _scanned  # type: ignore[assignment]


async def test_a_disconnect_looks_only_at_the_sockets_own_rooms() -> None:
    # Regression: python-socketio's manager copied and searched every room on each disconnect,
    # and each socket has a room of its own: closing 10,000 sockets at once stalled the loop 4 s.
    from bow_gateway.outbound import SocketOutbound

    async def publish(event: Any) -> None:
        pass

    outbound = SocketOutbound(outbounds={}, middlewares={}, indices={}, publish=publish)
    manager = outbound.sio.manager
    first, second = [await manager.connect(f"eio-{n}", "/") for n in range(2)]
    manager.rooms["/"] = _RoomsThatMustNotBeScanned(manager.rooms["/"])
    await manager.disconnect(first, "/")
    assert not manager.is_connected(first, "/")
    assert first not in dict.keys(manager.rooms["/"])
    assert manager.is_connected(second, "/")
    assert manager.sid_from_eio_sid("eio-1", "/") == second
