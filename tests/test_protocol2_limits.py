"""Protocol 2, end to end (section 10, and section 7's replay): a socket that stops reading is
closed with 4008 alone and recovers afterwards, events over ``outbound.max_event_bytes`` and
gateway names are refused before anyone gets them, and a replay goes at the pace of its reader.

Real gateways on free ports (the memory backplane) and real clients: python-socketio ones, and
raw websockets (aiohttp) that speak Engine.IO/Socket.IO frames themselves so that they can stop
reading. ``max_sockets`` (503 with ``Retry-After``) is tested in ``test_http_timeouts.py``, and
``__disconnect`` being accepted in ``test_inbound.py`` and ``test_protocol2_authentication.py``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow

from .support import AUTH, PATH, WAIT, Gateway, base_config, metric, token
from .support.protocol2 import P2Gateway, p2_bow, without_id

SLOW, FAST = "USER/slow", "USER/fast"
ROOM_A = {"room": "a"}

Serve = Callable[..., Awaitable[P2Gateway]]


@pytest.fixture
async def serve(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> AsyncIterator[Serve]:
    """``gateway = await serve(**config)``: :func:`p2_bow` (envelopes: name, payload, audience)
    with ``config`` overriding top-level sections, its watcher connected. Its clients are closed
    before it stops."""
    gateways: list[P2Gateway] = []

    async def start(**config: Any) -> P2Gateway:
        config["outbound"] = {"timeout": 5, **config.get("outbound", {})}
        gateway = P2Gateway(Gateway(await start_bow(p2_bow(base_config(**config))), http))
        gateways.append(gateway)
        await gateway.watch()
        return gateway

    yield start
    for gateway in gateways:
        await gateway.close()


class RawP2:
    """A protocol-2 socket spoken to in raw Engine.IO/Socket.IO frames over an aiohttp websocket:
    between two calls of :meth:`next` it reads nothing, so once aiohttp's own queue (64 KiB) and
    the kernel's receive buffer are full, the gateway's writes wait."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    @classmethod
    async def open(
        cls,
        http: aiohttp.ClientSession,
        url: str,
        listener_token: str,
        options: Any = None,
        *,
        receive_buffer: int | None = None,
    ) -> tuple[RawP2, Any]:
        """Connect with ``?v=1.3&proto=2`` (the kernel's receive buffer fixed to
        ``receive_buffer``, doubled by Linux), authenticate with ``options`` (``{}`` if None):
        the socket and its ack's result."""
        ws = await http.ws_connect(
            url + "/socket.io/?EIO=4&transport=websocket&v=1.3&proto=2", autoping=False
        )
        if receive_buffer is not None:
            raw = ws.get_extra_info("socket")
            assert raw is not None
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        assert (await ws.receive_str(timeout=WAIT)).startswith("0{")  # Engine.IO open
        await ws.send_str("40")  # Socket.IO connect to "/"
        assert (await ws.receive_str(timeout=WAIT)).startswith("40{")
        await ws.send_str("421" + json.dumps(["authenticate", listener_token, options or {}]))
        ack = await ws.receive_str(timeout=WAIT)
        assert ack.startswith("431["), ack
        [result] = json.loads(ack[3:])
        return cls(ws), result

    async def next(self, timeout: float = WAIT) -> tuple[str, list[Any]] | None:
        """The next event, ``(name, args)``, answering pings on the way: ``("disconnect", [])``
        for a Socket.IO disconnect, None once the connection is closed."""
        while True:
            message = await self.ws.receive(timeout=timeout)
            if message.type != aiohttp.WSMsgType.TEXT or message.data == "1":  # or Engine.IO CLOSE
                return None
            if message.data == "2":  # an Engine.IO ping
                await self.ws.send_str("3")
                continue
            if message.data == "41":  # a Socket.IO disconnect
                return "disconnect", []
            assert message.data.startswith("42["), message.data
            name, *args = json.loads(message.data[2:])
            return name, args

    async def close(self) -> None:
        await self.ws.close()


def compact_size(name: str, payload: Any) -> int:
    """The UTF-8 bytes of the compact JSON ``[name, payload]``: what ``max_event_bytes`` bounds."""
    return len(json.dumps([name, payload], separators=(",", ":"), ensure_ascii=False).encode())


async def post(gateway: P2Gateway, body: Any) -> tuple[int, str]:
    """POST a message: the status and the body of the answer."""
    async with gateway.http.post(gateway.url + PATH, json=body, headers=AUTH) as response:
        return response.status, await response.text()


# -- bytes waiting for one socket: 4008 slow --------------------------------------------------


async def test_a_socket_that_stops_reading_gets_4008_alone_then_recovers_the_rest(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    gateway = await serve()  # outbound.max_buffered_bytes: its default, 1 MiB
    fast, _ = await gateway.listener(token(FAST))
    slow, _ = await RawP2.open(http, gateway.url, token(SLOW))
    try:
        audience = [{"__id": SLOW}, {"__id": FAST}]
        first = await gateway.push({"name": "first", "audience": audience})
        name, (payload, meta) = await slow.next()
        assert (name, payload, without_id(meta)) == ("first", None, {"position": first})
        assert await fast.expect("first") == (None, {"position": first})

        # From now on the slow socket reads nothing: 64 events of 64 KiB, 4 MiB, for both.
        blob = "x" * 65_536
        started = time.monotonic()
        positions: list[str] = []
        for seq in range(64):
            posted = time.monotonic()
            body = {"name": "big", "payload": {"seq": seq, "blob": blob}, "audience": audience}
            positions.append(position := await gateway.push(body))
            payload, meta = await fast.expect("big")
            assert time.monotonic() - posted < 0.5, f"event {seq} took {time.monotonic() - posted}"
            assert (payload["seq"], meta) == (seq, {"position": position})
        for _ in range(300):
            if await metric(gateway.gateway, 'bow_disconnects_total{reason="slow"}') == 1:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the socket that stopped reading was not dropped")
        assert time.monotonic() - started < 3.0
        assert fast.client.connected
        await gateway.sentinel([{"__id": FAST}], fast)

        # It reads again: what reached it, in order, then the alert, then the close.
        received: list[str] = []
        while (event := await slow.next()) is not None and event[0] == "big":
            payload, meta = event[1]
            assert payload["seq"] == len(received) and without_id(meta) == {
                "position": positions[len(received)]
            }
            received.append(meta["position"])
        assert event is not None and event[0] == "alert", event
        text, info = event[1]
        assert isinstance(text, str) and text
        assert info == {"code": 4008, "reason": "slow", "fatal": True, "reconnect": "backoff"}
        assert await slow.next() == ("disconnect", [])
        assert await slow.next() is None
        assert len(received) < len(positions)

        # It comes back with the last position it got, and recovers every event after it.
        since = received[-1] if received else first
        again, ack = await gateway.listener(token(SLOW), {"since": since})
        assert (ack["recovered"], ack["reason"]) == (True, None), ack
        for seq in range(len(received), len(positions)):
            payload, meta = await again.expect("big")
            assert payload["seq"] == seq and meta == {"position": positions[seq], "replayed": True}
        await gateway.sentinel([{"__id": SLOW}], again)
    finally:
        await slow.close()


# -- the size of an event: 413 at the inbound ----------------------------------------------------


async def test_an_event_one_byte_over_max_event_bytes_is_413_and_reaches_nobody(
    serve: Serve,
) -> None:
    gateway = await serve(outbound={"max_event_bytes": 1_000})
    p2, _ = await gateway.listener(token("USER/1", ROOM_A))
    p1, _ = await gateway.listener(token("USER/2", ROOM_A), proto=None)
    away, _ = await gateway.listener(token("USER/3", ROOM_A))
    since = await gateway.push({"name": "before", "audience": [ROOM_A]})
    for client in (p2, away):
        assert await client.expect("before") == (None, {"position": since})
    assert await p1.expect("before") == ()
    await away.close()

    payload = {"text": "é" * 491}  # two UTF-8 bytes each: the size is in bytes, not characters
    assert compact_size("big", payload) == 1_001
    status, text = await post(gateway, {"name": "big", "payload": payload, "audience": [ROOM_A]})
    assert status == 413 and "1001 bytes" in text, (status, text)

    after = await gateway.push({"name": "after", "audience": [ROOM_A]})
    assert await p2.expect("after") == (None, {"position": after})  # the next event: not "big"
    assert await p1.expect("after") == ()
    # Never accepted, so not missed either: a socket recovering over it gets only "after".
    back, ack = await gateway.listener(token("USER/3", ROOM_A), {"since": since})
    assert (ack["recovered"], ack["reason"]) == (True, None), ack
    assert await back.expect("after") == (None, {"position": after, "replayed": True})
    await gateway.sentinel([{"__id": "USER/3"}], back)


async def test_an_event_of_exactly_max_event_bytes_is_delivered(serve: Serve) -> None:
    gateway = await serve(outbound={"max_event_bytes": 1_000})
    p2, _ = await gateway.listener(token("USER/1", ROOM_A))
    p1, _ = await gateway.listener(token("USER/2", ROOM_A), proto=None)
    payload = {"text": "é" * 490 + "x"}
    assert compact_size("big", payload) == 1_000
    position = await gateway.push({"name": "big", "payload": payload, "audience": [ROOM_A]})
    assert await p2.expect("big") == (payload, {"position": position})
    assert await p1.expect("big") == (payload,)


# -- gateway names: 422 ------------------------------------------------------------------------


async def test_messages_named_as_gateway_events_are_422_and_reach_nobody(serve: Serve) -> None:
    gateway = await serve()
    client, _ = await gateway.listener(token("USER/1"))
    for name in ("__position", "__gap", "__x", "__"):
        body = {"name": name, "payload": None, "audience": [{"__id": "USER/1"}]}
        status, text = await post(gateway, body)
        assert status == 422 and "reserved" in text, (name, status, text)
    await gateway.sentinel([{"__id": "USER/1"}], client)  # the next event: no forged one
    assert client.alerts == [] and client.client.connected


# -- a replay at the pace of its reader ------------------------------------------------------


async def test_a_replay_to_a_slow_reader_is_complete_in_order_then_live_none_twice(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    # 300 events of 4 KiB to replay, over four times max_buffered_bytes: written as they are read
    gateway = await serve(outbound={"max_buffered_bytes": 262_144}, recovery={"max_replay": 400})
    first, _ = await gateway.listener(token("USER/1"))
    since = await gateway.sentinel([{"__id": "USER/1"}], first)
    await first.close()
    audience = [{"__id": "USER/1"}]
    blob = "y" * 4_096
    missed = [
        await gateway.push(
            {"name": "missed", "payload": {"seq": seq, "blob": blob}, "audience": audience}
        )
        for seq in range(300)
    ]
    await gateway.settle()

    client, ack = await RawP2.open(http, gateway.url, token("USER/1"), {"since": since})
    try:
        assert (ack["recovered"], ack["reason"]) == (True, None), ack
        events: list[tuple[str, list[Any]]] = []
        read_when_pushed: list[int] = []  # how many events the client had read at each push

        async def live() -> list[str]:
            positions = []
            for seq in range(20):
                body = {"name": "live", "payload": {"seq": seq}, "audience": audience}
                positions.append(await gateway.push(body))
                read_when_pushed.append(len(events))
            return positions

        pushing = asyncio.ensure_future(live())
        while len(events) < len(missed) + 20:
            event = await client.next()
            assert event is not None, f"closed after {len(events)} events: {events[-2:]}"
            events.append(event)
            if len(events) % 10 == 0:
                await asyncio.sleep(0.02)  # a slow reader: the replay takes over half a second
        pushed = await pushing
        assert read_when_pushed[0] < len(missed) / 2  # the live ones came during the replay

        replayed, lived = events[: len(missed)], events[len(missed) :]
        assert [(name, without_id(meta)) for name, (_, meta) in replayed] == [
            ("missed", {"position": position, "replayed": True}) for position in missed
        ]
        assert [payload["seq"] for _, (payload, _) in replayed] == list(range(300))
        assert [(name, without_id(meta)) for name, (_, meta) in lived] == [
            ("live", {"position": position}) for position in pushed
        ]
        assert await metric(gateway.gateway, 'bow_disconnects_total{reason="slow"}') == 0
    finally:
        await client.close()
