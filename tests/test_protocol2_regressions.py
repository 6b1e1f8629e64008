"""Protocol 2 (sections 6-10): one regression test per failure a review found (fixed in 4fae3b7).

Each test is named for the failure it guards against. Real gateways on free ports (the memory
backplane, or a private redis-server), real python-socketio clients, and a raw websocket where a
client must stop reading.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest
from bow_gateway.inbounds.passthrough import create_message_from_envelope
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound

from bow_gateway import Bow

from .support import (
    AUTH,
    PATH,
    SECRET,
    WAIT,
    Gateway,
    base_config,
    connect_error,
    metric,
    token,
    until,
)
from .support.protocol2 import BLOG_42, P2, P2Gateway, closed_with, p2_bow, without_id
from .support.redis_server import RedisServer

AUTHOR = {"role": "author", "blogId": 42}
V2_PATH = "/v2/messages"
CRITERIA = "/_bow/criteria"
DISCONNECT = "/_bow/disconnect"
JWT = JwtOutbound(secret=SECRET)

StartBow = Callable[[Bow], Awaitable[Bow]]


@pytest.fixture
async def gateways(http: aiohttp.ClientSession) -> AsyncIterator[list[P2Gateway]]:
    """Gateways a test started (through ``start_bow``, which stops them): their clients are
    closed first."""
    started: list[P2Gateway] = []
    yield started
    for gateway in started:
        await gateway.close()


async def serve(
    start_bow: StartBow,
    http: aiohttp.ClientSession,
    gateways: list[P2Gateway],
    bow: Bow,
    *,
    watch: bool = True,
) -> P2Gateway:
    gateway = P2Gateway(Gateway(await start_bow(bow), http))
    gateways.append(gateway)
    if watch:
        await gateway.watch()
    return gateway


def config(**overrides: Any) -> dict[str, Any]:
    overrides["outbound"] = {"timeout": 5, **overrides.get("outbound", {})}
    return base_config(**overrides)


async def post(gateway: P2Gateway, path: str, body: Any) -> tuple[int, dict[str, str]]:
    async with gateway.http.post(gateway.url + path, json=body, headers=AUTH) as response:
        await response.read()
        return response.status, dict(response.headers)


async def expect_skipping_positions(client: P2, name: str) -> tuple[Any, ...]:
    """The next event but ``__position`` ones must be ``name``: its arguments."""
    while (event := await client.next())[0] == "__position":
        pass
    assert event[0] == name, event
    return event[1]


# -- 1. a replay keeps to the socket's middleware version ---------------------------------------


async def test_a_replay_never_crosses_middleware_versions(
    start_bow: StartBow, http: aiohttp.ClientSession, gateways: list[P2Gateway]
) -> None:
    claims = criteria_from_claim()
    bow = (
        Bow(config())
        .middleware(version="v1.1", create_criteria_from_listener_details=claims)
        .middleware(version="v2", create_criteria_from_listener_details=claims)
        .inbound(
            path=PATH,
            create_message_from_request_body=create_message_from_envelope,
            middleware_version="v1.1",
        )
        .inbound(
            path=V2_PATH,
            create_message_from_request_body=create_message_from_envelope,
            middleware_version="v2",
        )
        .outbound(version="v1.3", create_listener_details_from_token=JWT, middleware_version="v1.1")
        .outbound(version="v9", create_listener_details_from_token=JWT, middleware_version="v2")
    )
    gateway = await serve(start_bow, http, gateways, bow)

    async def push_v2(name: str) -> str:
        status, headers = await post(gateway, V2_PATH, {"name": name, "audience": BLOG_42})
        assert status == 204
        return headers["Bow-Position"]

    client = P2(gateway.url)
    gateway.clients.append(client)
    await client.connect(version="v9")
    await client.authenticate(token("USER/1", AUTHOR))
    seen = await push_v2("seen")
    assert await client.expect("seen") == (None, {"position": seen})
    await client.close()

    await gateway.push({"name": "of-v1.1", "audience": BLOG_42})  # same audience, other version
    of_v2 = await push_v2("of-v2")
    await gateway.settle()

    again = P2(gateway.url)
    gateway.clients.append(again)
    await again.connect(version="v9")
    ack = await again.authenticate(token("USER/1", AUTHOR), {"since": seen})
    assert (ack["recovered"], ack["reason"]) == (True, None), ack
    assert await again.expect("of-v2") == (None, {"position": of_v2, "replayed": True})
    last = await push_v2("live")
    assert await again.expect("live") == (None, {"position": last})  # of-v1.1 never came


# -- 2. a control change made while an authentication ran wins over it -------------------------


class Gate:
    """A middleware (criteria from the token's claim) that, once armed, waits until released
    and then answers what it read before: stale criteria."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, details: Any) -> Any:
        criteria = details["claims"]["criteria"]
        if self.armed:
            self.entered.set()
            await self.release.wait()
        return criteria


def gated_bow(gate: Gate) -> Bow:
    return (
        Bow(config())
        .middleware(version="v1.1", create_criteria_from_listener_details=gate)
        .inbound(
            path=PATH,
            create_message_from_request_body=create_message_from_envelope,
            middleware_version="v1.1",
        )
        .outbound(version="v1.3", create_listener_details_from_token=JWT, middleware_version="v1.1")
    )


async def authenticating(
    gateway: P2Gateway, gate: Gate, listener_token: str
) -> tuple[P2, list[Any]]:
    """A socket whose ``authenticate`` waits in the middleware: it and its acks (so far none)."""
    client = await gateway.connect()
    gate.armed = True
    acks = await client.authenticate_unacked(listener_token)
    await asyncio.wait_for(gate.entered.wait(), WAIT)
    return client, acks


async def test_a_criteria_change_during_an_authentication_is_not_undone_by_its_stale_criteria(
    start_bow: StartBow, http: aiohttp.ClientSession, gateways: list[P2Gateway]
) -> None:
    gate = Gate()
    gateway = await serve(start_bow, http, gateways, gated_bow(gate))
    admin = token("X", {"role": "admin"})
    connected, _ = await gateway.listener(admin)
    pending, acks = await authenticating(gateway, gate, admin)

    status, _ = await post(gateway, CRITERIA, {"id": "X", "criteria": {}})  # revoked
    assert status == 204
    await gateway.settle()  # the change has reached this instance
    gate.release.set()  # the middleware answers {"role": "admin"}, read before the 204
    await until(lambda: acks, "the pending authentication's ack")
    await gateway.settle()  # and its CriteriaEvent (stale) has been applied

    await gateway.push({"name": "admin-only", "audience": [{"role": "admin"}]})
    await gateway.sentinel([{"__id": "X"}], connected, pending)  # the next event of both
    assert pending.client.connected and connected.client.connected


async def test_a_kick_during_an_authentication_closes_the_authenticating_socket_with_4005(
    start_bow: StartBow, http: aiohttp.ClientSession, gateways: list[P2Gateway]
) -> None:
    gate = Gate()
    gateway = await serve(start_bow, http, gateways, gated_bow(gate))
    admin = token("X", {"role": "admin"})
    connected, _ = await gateway.listener(admin)
    pending, acks = await authenticating(gateway, gate, admin)

    status, _ = await post(gateway, DISCONNECT, {"ids": ["X"]})
    assert status == 204
    await closed_with(connected, 4005)
    await gateway.settle()
    assert pending.client.connected  # still authenticating
    gate.release.set()
    await closed_with(pending, 4005)
    assert acks == []


# -- 3. control events do not push messages out of the window ----------------------------------


async def test_control_events_do_not_push_messages_out_of_the_recovery_window(
    start_bow: StartBow, http: aiohttp.ClientSession, gateways: list[P2Gateway]
) -> None:
    gateway = await serve(start_bow, http, gateways, p2_bow(config(recovery={"max_count": 20})))
    client, _ = await gateway.listener(token("USER/1", AUTHOR))
    seen = await gateway.push({"name": "seen", "audience": BLOG_42})
    assert await client.expect("seen") == (None, {"position": seen})
    await client.close()

    missed = await gateway.push({"name": "missed", "audience": BLOG_42})
    for n in range(25):  # each authentication publishes a CriteriaEvent
        await gateway.listener(token(f"OTHER/{n}", {"blogId": 7}))
    await gateway.settle()

    again, ack = await gateway.listener(token("USER/1", AUTHOR), {"since": seen})
    assert (ack["recovered"], ack["reason"]) == (True, None), ack
    assert await again.expect("missed") == (None, {"position": missed, "replayed": True})
    await gateway.sentinel(BLOG_42, again)


# -- 4. since on a re-authentication is ignored -------------------------------------------------


async def test_since_on_a_re_authentication_replays_nothing(
    start_bow: StartBow, http: aiohttp.ClientSession, gateways: list[P2Gateway]
) -> None:
    gateway = await serve(start_bow, http, gateways, p2_bow(config()))
    client, first = await gateway.listener(token("USER/1", AUTHOR))
    assert first["recovered"] is None
    before = await gateway.push({"name": "before", "audience": BLOG_42})
    assert await client.expect("before") == (None, {"position": before})
    a = await gateway.push({"name": "a", "audience": BLOG_42})
    assert await client.expect("a") == (None, {"position": a})

    ack = await client.authenticate(token("USER/1", AUTHOR), {"since": before})
    assert ack["recovered"] is None and ack["reason"] is None, ack
    await gateway.sentinel(BLOG_42, client)  # a is not delivered again


# -- 5. a position from the start of an epoch recovers on an instance started later ------------


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


async def test_a_position_from_the_start_of_an_epoch_recovers_on_an_instance_started_later(
    start_bow: StartBow,
    http: aiohttp.ClientSession,
    gateways: list[P2Gateway],
    redis_server: RedisServer,
) -> None:
    settings = config(redis=redis_server.url, namespace=f"p2-{uuid.uuid4().hex[:8]}")
    a = await serve(start_bow, http, gateways, p2_bow(settings), watch=False)
    client, ack = await a.listener(token("USER/1", AUTHOR))  # before any message
    origin = ack["position"]
    assert isinstance(origin, str) and origin, ack
    await client.close()

    names = [f"m{n}" for n in range(5)]
    positions = [
        await a.push({"name": name, "payload": {"n": n}, "audience": BLOG_42})
        for n, name in enumerate(names)
    ]
    await a.push({"name": "elsewhere", "audience": [{"blogId": 7}]})

    b = await serve(start_bow, http, gateways, p2_bow(settings), watch=False)
    again, ack = await b.listener(token("USER/1", AUTHOR), {"since": origin})
    assert (ack["recovered"], ack["reason"]) == (True, None), ack
    for n, (name, position) in enumerate(zip(names, positions, strict=True)):
        assert await again.expect(name) == ({"n": n}, {"position": position, "replayed": True})
    last = await b.push({"name": "live", "audience": BLOG_42})
    assert await expect_skipping_positions(again, "live") == (None, {"position": last})


# -- 6. a socket closed as slow is cut off without waiting for its client -----------------------


def connection_of(gateway: P2Gateway, listener_id: str) -> Any:
    """The gateway's (in-process) connection of ``listener_id``'s one socket."""
    outbound = gateway.bow._outbound
    assert outbound is not None
    [connection] = [c for c in outbound.connections.values() if c.listener_id == listener_id]
    return connection


class NeverReads:
    """A protocol-2 websocket over a bare TCP socket (its receive buffer small): it reads the
    handshake, its open, connect and ack frames, then never reads again, so that what the
    gateway writes stays in the gateway's buffers."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @classmethod
    async def open(cls, url: str, listener_token: str) -> NeverReads:
        port = int(url.rsplit(":", 1)[1])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4_096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, ("127.0.0.1", port))
        client = cls(sock)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            "GET /socket.io/?EIO=4&transport=websocket&v=v1.3&proto=2 HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        await loop.sock_sendall(sock, request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += await client._read(1)
        assert head.startswith(b"HTTP/1.1 101"), head
        assert (await client.receive()).startswith("0{")  # Engine.IO open
        await client.send("40")
        assert (await client.receive()).startswith("40{")
        await client.send("421" + json.dumps(["authenticate", listener_token, {}]))
        ack = await client.receive()
        assert ack.startswith("431["), ack
        return client

    async def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = await asyncio.wait_for(
                asyncio.get_running_loop().sock_recv(self.sock, size - len(data)), WAIT
            )
            assert chunk, "the gateway closed the connection"
            data += chunk
        return data

    async def receive(self) -> str:
        """One text frame (unmasked, unfragmented, as the gateway sends them)."""
        first, second = await self._read(2)
        assert first == 0x81, first
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", await self._read(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", await self._read(8))[0]
        return (await self._read(length)).decode()

    async def send(self, text: str) -> None:
        data, mask = text.encode(), os.urandom(4)
        header = bytes([0x81, 0x80 | len(data)]) if len(data) < 126 else None
        if header is None:
            header = bytes([0x81, 0x80 | 126]) + struct.pack("!H", len(data))
        masked = bytes(byte ^ mask[n % 4] for n, byte in enumerate(data))
        await asyncio.get_running_loop().sock_sendall(self.sock, header + mask + masked)

    def close(self) -> None:
        self.sock.close()


async def test_a_slow_socket_that_never_reads_is_cut_off_within_2_s_of_its_4008(
    start_bow: StartBow, http: aiohttp.ClientSession, gateways: list[P2Gateway]
) -> None:
    settings = config(outbound={"max_buffered_bytes": 65_536})
    gateway = await serve(start_bow, http, gateways, p2_bow(settings))
    slow = await NeverReads.open(gateway.url, token("USER/slow"))
    try:
        audience = [{"__id": "USER/slow"}]
        first = await gateway.push({"name": "first", "audience": audience})
        assert without_id(json.loads((await slow.receive())[2:])[2]) == {"position": first}
        transport = connection_of(gateway, "USER/slow").transport  # its TCP connection
        assert transport is not None and not transport.is_closing()

        blob = "x" * 16_384  # from now on the client reads nothing
        for seq in range(100):  # 1.6 MiB at most, far over what the buffers hold
            body = {"name": "big", "payload": {"seq": seq, "blob": blob}, "audience": audience}
            await gateway.push(body)
            if await metric(gateway.gateway, 'bow_disconnects_total{reason="slow"}') == 1:
                break
        else:
            pytest.fail("the socket that stopped reading was not closed as slow")
        closed_at = time.monotonic()
        await until(
            lambda: transport._sock is None,  # connection_lost: the server closed its side
            "the server to cut the slow socket off",
            timeout=2.0,
        )
        assert time.monotonic() - closed_at < 2.0
        await gateway.settle()  # the watcher is served as before
    finally:
        slow.close()


# -- 7. 4012 reaches long-polling clients --------------------------------------------------------


class Polling:
    """A protocol-2 socket on Engine.IO long-polling spoken to in raw HTTP requests, one at a
    time on one kept-alive connection: no poll waits at the gateway unless :meth:`poll` runs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
        self.sid = ""

    async def open(self) -> None:
        query = "/socket.io/?EIO=4&transport=polling&v=v1.3&proto=2"
        async with self.http.get(self.url + query) as response:
            text = await response.text()
        assert text.startswith("0{"), text
        self.sid = json.loads(text[1:])["sid"]
        self.url += f"{query}&sid={self.sid}"
        await self.send("40")
        [connected] = await self.poll()
        assert connected.startswith("40{"), connected

    async def send(self, packet: str) -> None:
        async with self.http.post(self.url, data=packet.encode()) as response:
            assert response.status == 200, await response.text()

    async def poll(self) -> list[str]:
        """One long-poll: the Engine.IO packets it brought."""
        async with self.http.get(self.url, timeout=aiohttp.ClientTimeout(total=WAIT)) as response:
            text = await response.text()
            assert response.status == 200, (response.status, text)
        return text.split("\x1e")

    async def close(self) -> None:
        await self.http.close()


async def test_stopping_sends_4012_to_a_protocol_2_socket_on_long_polling(
    start_bow: StartBow, http: aiohttp.ClientSession, gateways: list[P2Gateway]
) -> None:
    gateway = await serve(start_bow, http, gateways, p2_bow(config()), watch=False)
    client = Polling(gateway.url)
    try:
        await client.open()
        await client.send("421" + json.dumps(["authenticate", token("USER/1", AUTHOR), {}]))
        [ack] = await client.poll()
        assert ack.startswith("431[") and json.loads(ack[3:])[0]["id"] == "USER/1", ack
        connection = connection_of(gateway, "USER/1")

        stopping = asyncio.create_task(gateway.bow.stop())
        while connection.closing is None and not stopping.done():
            await asyncio.sleep(0)  # until stop() has written the alerts, no poll under way
        packets = await client.poll()  # the client comes back for what waits
        await stopping
    finally:
        await client.close()
    alerts = [json.loads(p[2:]) for p in packets if p.startswith("42")]
    assert [alert[0] for alert in alerts] == ["alert"], packets
    _, text, info = alerts[0]
    assert isinstance(text, str) and text
    assert info == {"code": 4012, "reason": "shutdown", "fatal": True, "reconnect": "now"}


# -- 8. exp must be a finite time ----------------------------------------------------------------


def listener_fn(listener_token: Any) -> dict[str, Any]:
    """A JWT (the watcher's) as the bundled outbound reads it; a mapping ``{"id", "exp"}`` as
    those details, ``exp`` as ``float(exp)`` (JSON has no NaN)."""
    if isinstance(listener_token, str):
        return dict(JWT(listener_token))
    return {
        "id": listener_token["id"],
        "claims": {"criteria": {}},
        "exp": float(listener_token["exp"]),
    }


@pytest.mark.parametrize("exp", ["nan", "inf", "1e300"])
async def test_an_exp_that_is_not_a_finite_time_gets_4002_and_no_4100(
    start_bow: StartBow, http: aiohttp.ClientSession, gateways: list[P2Gateway], exp: str
) -> None:
    gateway = await serve(start_bow, http, gateways, p2_bow(config(), listener_fn=listener_fn))
    client = await gateway.connect()
    acks = await client.authenticate_unacked({"id": "USER/1", "exp": exp})
    info = await closed_with(client, 4002)
    assert info["reason"] == "auth_refused"
    assert len(client.alerts) == 1, client.alerts  # no 4100 before it
    assert acks == []


# -- 9. an empty proto is 4022 -------------------------------------------------------------------


async def test_an_empty_proto_is_refused_with_4022(
    start_bow: StartBow, http: aiohttp.ClientSession, gateways: list[P2Gateway]
) -> None:
    gateway = await serve(start_bow, http, gateways, p2_bow(config()), watch=False)
    data = await connect_error(gateway.url + "?v=v1.3&proto=")
    assert data["data"] == {"code": 4022, "reason": "bad_protocol", "reconnect": "never"}, data
