"""Contract section 3, the Socket.IO outbound, end to end.

Every test runs a real gateway on a free port and talks to it with the real python-socketio
``AsyncClient`` (websocket transport, and once over long-polling). Absence of a delivery is shown
without sleeping where possible: a *sentinel* message is pushed after the one that must not
arrive, and since delivery is in order, the sentinel must be the next event the socket sees.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import jwt
import pytest
import socketio
from bow_gateway.inbounds.passthrough import create_message_from_envelope
from bow_gateway.middlewares.claims import criteria_from_claim

from bow_gateway import Bow

from .support import (
    AUTH,
    NO_DATA,
    PATH,
    SECRET,
    Listener,
    base_config,
    read_metric,
    short_heartbeats,
    standard_bow,
    token,
)

WAIT = 5.0  # seconds any single expected thing may take before the test fails
CRITERIA_FROM_CLAIM = criteria_from_claim()


# -- helpers ---------------------------------------------------------------------------------


class Client(Listener):
    """A ``Listener`` that also keeps the order of what happened to it: events, then disconnect."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.log: list[str] = []

    async def _on_any(self, event: str, *data: Any) -> None:
        self.log.append(event)
        await super()._on_any(event, *data)

    async def _on_disconnect(self, *args: Any) -> None:
        self.log.append("disconnect")
        await super()._on_disconnect(*args)

    async def close(self) -> None:
        # Also when never connected: a failed connect leaves the client's HTTP session open.
        await self.client.disconnect()

    async def wait_disconnected(self, timeout: float = WAIT) -> None:
        await asyncio.wait_for(self.disconnected.wait(), timeout)

    async def authenticate_with_ack(self, listener_token: Any, timeout: float = WAIT) -> None:
        """Emit ``authenticate`` with an acknowledgement callback; wait until it is called."""
        acked = asyncio.Event()
        await self.client.emit("authenticate", (listener_token,), callback=lambda *_: acked.set())
        await asyncio.wait_for(acked.wait(), timeout)

    async def expect(self, name: str, timeout: float = WAIT) -> Any:
        """The next event must be ``name``; returns its data."""
        event, data = await self.next_event(timeout)
        assert event == name, f"expected {name!r}, got {event!r} with {data!r}"
        return data


class Gateway:
    """One running gateway: where it is, how to push to it, and its clients (closed at the end)."""

    def __init__(self, bow: Bow, http: aiohttp.ClientSession) -> None:
        self.bow = bow
        self.url = f"http://127.0.0.1:{bow.port}"
        self.http = http
        self.clients: list[Client] = []
        self._sentinels = 0

    async def push(self, body: Any) -> None:
        async with self.http.post(self.url + PATH, json=body, headers=AUTH) as response:
            text = await response.text()
            assert response.status == 204, f"push refused: {response.status} {text}"

    async def connect(self, version: str | None = "v1.3", **kwargs: Any) -> Client:
        client = Client(self.url)
        self.clients.append(client)
        await client.connect(version, **kwargs)
        return client

    async def listener(
        self, listener_token: Any, version: str | None = "v1.3", **kwargs: Any
    ) -> Client:
        """A connected socket, authenticated with ``listener_token`` (its ack received)."""
        client = await self.connect(version, **kwargs)
        await client.authenticate_with_ack(listener_token)
        return client

    async def jwt_listener(
        self, listener_id: str, criteria: dict[str, Any] | None = None
    ) -> Client:
        return await self.listener(token(listener_id, criteria))

    async def sentinel(self, audience: list[dict[str, Any]], *clients: Client) -> None:
        """Push a message to ``audience``; each of ``clients`` must see it as its next event."""
        self._sentinels += 1
        name = f"sentinel-{self._sentinels}"
        await self.push({"name": name, "audience": audience})
        for client in clients:
            await client.expect(name)

    async def close(self) -> None:
        await asyncio.gather(*(client.close() for client in self.clients))


@pytest.fixture
async def serve(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> AsyncIterator[Callable[[Bow], Awaitable[Gateway]]]:
    """``gateway = await serve(some_bow)``: start it; its clients are closed before it stops."""
    gateways: list[Gateway] = []

    async def start(bow: Bow) -> Gateway:
        gateway = Gateway(await start_bow(bow), http)
        gateways.append(gateway)
        return gateway

    yield start
    for gateway in gateways:
        await gateway.close()


@pytest.fixture
async def gateway(serve: Callable[[Bow], Awaitable[Gateway]]) -> Gateway:
    """The quick-start gateway: JWT outbound v1.3 (id from ``sub``), criteria from the token."""
    return await serve(standard_bow())


def plugin_bow(
    listener_fn: Callable[[Any], Any],
    criteria_fn: Callable[[Any], Any] = CRITERIA_FROM_CLAIM,
    *,
    timeout: float = 5,
) -> Bow:
    """A gateway with the user's own outbound v1.3 and middleware; messages are envelopes."""
    return (
        Bow(base_config(outbound={"timeout": timeout}))
        .middleware(version="v1.1", create_criteria_from_listener_details=criteria_fn)
        .inbound(
            path=PATH,
            create_message_from_request_body=create_message_from_envelope,
            middleware_version="v1.1",
        )
        .outbound(
            version="v1.3",
            create_listener_details_from_token=listener_fn,
            middleware_version="v1.1",
        )
    )


def as_kind(kind: str, function: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``function`` itself (``plain``) or a coroutine function that does the same."""
    if kind == "plain":
        return function

    async def coroutine_function(argument: Any) -> Any:
        await asyncio.sleep(0)
        return function(argument)

    return coroutine_function


def good_or(bad: Callable[[], Any]) -> Callable[[Any], Any]:
    """A listener_fn: the token ``"good"`` is listener ``GOOD``; any other token gets ``bad()``."""

    def listener_fn(listener_token: Any) -> Any:
        return {"id": "GOOD"} if listener_token == "good" else bad()

    return listener_fn


def lobby_or(bad: Callable[[], Any]) -> Callable[[Any], Any]:
    """A criteria_fn: listener ``GOOD`` is in the lobby; any other listener gets ``bad()``."""

    def criteria_fn(details: Any) -> Any:
        return {"room": "lobby"} if details["id"] == "GOOD" else bad()

    return criteria_fn


def raise_(error: Exception) -> Callable[[], Any]:
    def bad() -> Any:
        raise error

    return bad


def returns(value: Any) -> Callable[[], Any]:
    return lambda: value


async def refused_alone(
    gateway: Gateway, victim: Client, bystander: Client, audience: list[dict[str, Any]]
) -> str:
    """``victim`` gets ``alert`` then a disconnect; ``bystander`` (reached by ``audience``) stays
    connected and keeps receiving. Returns the alert's text."""
    await victim.wait_disconnected()
    assert victim.log == ["alert", "disconnect"], victim.log
    assert not victim.client.connected
    [alert] = victim.alerts
    assert isinstance(alert, str) and alert
    assert bystander.client.connected
    await gateway.sentinel(audience, bystander)
    return alert


async def happens(event: asyncio.Event, within: float = 0.5) -> bool:
    """Whether ``event`` is set within ``within`` seconds (to show that something does not)."""
    try:
        await asyncio.wait_for(event.wait(), within)
    except TimeoutError:
        return False
    return True


async def connect_error(url: str, namespace: str = "/") -> Any:
    """Connect and expect a refusal: the data of the ``connect_error`` event the client got."""
    client = socketio.AsyncClient(reconnection=False)
    errors: list[Any] = []
    client.on("connect_error", lambda *data: errors.append(data), namespace=namespace)
    try:
        with pytest.raises(socketio.exceptions.ConnectionError):
            await client.connect(
                url, transports=["websocket"], namespaces=[namespace], wait_timeout=WAIT
            )
    finally:
        await client.disconnect()
    assert not client.connected
    assert len(errors) == 1, errors
    [data] = errors[0]
    return data


# -- handshake: the version query and the namespace ------------------------------------------


def two_outbounds() -> Bow:
    """Outbounds v1.3 and v2 whose listener ids say which one made them."""
    return plugin_bow(lambda t: {"id": f"v1.3/{t}"}, lambda details: {}).outbound(
        version="v2",
        create_listener_details_from_token=lambda t: {"id": f"v2/{t}"},
        middleware_version="v1.1",
    )


@pytest.mark.parametrize("v", ["1.3", "v1.3"])
async def test_version_query_with_or_without_leading_v_reaches_outbound_v1_3(
    serve: Callable[[Bow], Awaitable[Gateway]], v: str
) -> None:
    gateway = await serve(two_outbounds())
    client = await gateway.listener("me", version=v)
    await gateway.sentinel([{"__id": "v1.3/me"}], client)


@pytest.mark.parametrize("v", ["2", "v2"])
async def test_version_query_selects_among_several_outbounds(
    serve: Callable[[Bow], Awaitable[Gateway]], v: str
) -> None:
    gateway = await serve(two_outbounds())
    client = await gateway.listener("me", version=v)
    await gateway.push({"name": "for-v1.3", "audience": [{"__id": "v1.3/me"}]})
    await gateway.sentinel([{"__id": "v2/me"}], client)


async def test_missing_version_is_refused_with_connect_error_saying_why(gateway: Gateway) -> None:
    data = await connect_error(gateway.url)
    message = data["message"]
    assert "version" in message and "v=" in message, message


async def test_empty_version_is_refused_with_connect_error(gateway: Gateway) -> None:
    data = await connect_error(gateway.url + "?v=")
    assert "version" in data["message"], data


async def test_unknown_version_is_refused_with_connect_error_naming_it(gateway: Gateway) -> None:
    data = await connect_error(gateway.url + "?v=v9.9")
    message = data["message"]
    assert "unknown outbound version" in message and "v9.9" in message, message
    assert "v1.3" in message, message  # and says what is served


async def test_other_namespace_is_refused_with_connect_error_saying_why(gateway: Gateway) -> None:
    data = await connect_error(gateway.url + "?v=1.3", namespace="/admin")
    message = data["message"]
    assert "namespace" in message and "/admin" in message, message


async def test_refused_handshake_leaves_other_sockets_served(gateway: Gateway) -> None:
    bystander = await gateway.jwt_listener("USER/1")
    await connect_error(gateway.url)
    await connect_error(gateway.url + "?v=1.3", namespace="/admin")
    await gateway.sentinel([{"__id": "USER/1"}], bystander)


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


# -- refusals: alert, then a disconnect of that socket only ------------------------------------


async def test_authenticate_without_token_is_refused(gateway: Gateway) -> None:
    bystander = await gateway.jwt_listener("USER/1")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "USER/1"}])
    assert "token" in alert


async def test_authenticate_with_null_token_is_refused(gateway: Gateway) -> None:
    bystander = await gateway.jwt_listener("USER/1")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", (None,), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "USER/1"}])
    assert "token" in alert


async def test_authenticate_without_acknowledgement_callback_is_refused(gateway: Gateway) -> None:
    bystander = await gateway.jwt_listener("USER/1")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", token("USER/2"))
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "USER/1"}])
    assert "acknowledgement" in alert


@pytest.mark.parametrize(
    ("bad_token", "reason"),
    [
        ("not-a-jwt", "invalid token"),
        (token("USER/2", ttl=-60), "expired"),
        (token("USER/2").rsplit(".", 1)[0] + ".c2lnbmF0dXJl", "invalid token"),
        (
            jwt.encode({"sub": "USER/2"}, "another-secret-" + SECRET, "HS256"),
            "invalid token",
        ),
        (42, "string"),
    ],
    ids=["garbage", "expired", "bad-signature", "other-secret", "not-a-string"],
)
async def test_rejected_token_is_refused(gateway: Gateway, bad_token: Any, reason: str) -> None:
    bystander = await gateway.jwt_listener("USER/1")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", (bad_token,), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "USER/1"}])
    assert reason in alert.lower(), alert


@pytest.mark.parametrize("kind", ["plain", "coroutine"])
async def test_listener_fn_raising_is_refused(
    serve: Callable[[Bow], Awaitable[Gateway]], kind: str
) -> None:
    gateway = await serve(plugin_bow(as_kind(kind, good_or(raise_(LookupError("no such user"))))))
    bystander = await gateway.listener("good")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", ("bad",), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "GOOD"}])
    assert "no such user" in alert


@pytest.mark.parametrize(
    "details",
    [{}, {"id": True}, {"id": ""}, {"id": {"a": 1}}, {"id": None}, {"id": [1]}, None, "GOOD"],
    ids=["missing", "true", "empty", "dict", "null", "list", "none", "not-a-mapping"],
)
@pytest.mark.parametrize("kind", ["plain", "coroutine"])
async def test_listener_fn_returning_no_valid_id_is_refused(
    serve: Callable[[Bow], Awaitable[Gateway]], kind: str, details: Any
) -> None:
    gateway = await serve(plugin_bow(as_kind(kind, good_or(returns(details)))))
    bystander = await gateway.listener("good")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", ("bad",), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "GOOD"}])
    assert "id" in alert or "mapping" in alert, alert


@pytest.mark.parametrize("kind", ["plain", "coroutine"])
async def test_criteria_fn_raising_is_refused(
    serve: Callable[[Bow], Awaitable[Gateway]], kind: str
) -> None:
    criteria_fn = as_kind(kind, lobby_or(raise_(RuntimeError("database down"))))
    gateway = await serve(plugin_bow(lambda t: {"id": t.upper()}, criteria_fn))
    bystander = await gateway.listener("good")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", ("bad",), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"room": "lobby"}])
    assert "criteria" in alert and "BAD" in alert, alert


async def test_criteria_fn_raising_lookup_error_is_refused_with_its_message(
    serve: Callable[[Bow], Awaitable[Gateway]],
) -> None:
    # A middleware that does not know a listener (the precomputed one) says so to the client.
    criteria_fn = lobby_or(raise_(LookupError("listener 'BAD' has no precomputed criteria")))
    gateway = await serve(plugin_bow(lambda t: {"id": t.upper()}, criteria_fn))
    bystander = await gateway.listener("good")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", ("bad",), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"room": "lobby"}])
    assert alert == "listener 'BAD' has no precomputed criteria"


@pytest.mark.parametrize(
    "criteria",
    [
        {"room": {"nested": 1}},
        {"room": ""},
        {"room": None},
        {"room": [["nested"]]},
        {"room": [""]},
        {"room": [{"a": 1}]},
        {"room": float("nan")},
        {1: "numeric-key"},
        ["room", "lobby"],
        None,
    ],
    ids=[
        "nested-dict",
        "empty-string",
        "null",
        "nested-list",
        "list-of-empty-string",
        "list-of-dict",
        "nan",
        "non-string-key",
        "list",
        "none",
    ],
)
@pytest.mark.parametrize("kind", ["plain", "coroutine"])
async def test_criteria_fn_returning_invalid_criteria_is_refused(
    serve: Callable[[Bow], Awaitable[Gateway]], kind: str, criteria: Any
) -> None:
    criteria_fn = as_kind(kind, lobby_or(returns(criteria)))
    gateway = await serve(plugin_bow(lambda t: {"id": t.upper()}, criteria_fn))
    bystander = await gateway.listener("good")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", ("bad",), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"room": "lobby"}])
    assert "criteria" in alert, alert


@pytest.mark.parametrize("own_id", ["BAD", "GOOD", 1])
async def test_criteria_setting_id_themselves_are_refused(
    serve: Callable[[Bow], Awaitable[Gateway]], own_id: Any
) -> None:
    criteria_fn = lobby_or(returns({"room": "lobby", "__id": own_id}))
    gateway = await serve(plugin_bow(lambda t: {"id": t.upper()}, criteria_fn))
    bystander = await gateway.listener("good")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", ("bad",), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "GOOD"}])
    assert "__id" in alert, alert


async def test_refused_authentication_leaves_the_ids_other_sockets_untouched(
    gateway: Gateway,
) -> None:
    first = await gateway.jwt_listener("USER/1", {"room": "a"})
    victim = await gateway.connect()
    await victim.client.emit(
        "authenticate", (token("USER/1", {"room": {"x": 1}}),), callback=lambda *_: None
    )
    await refused_alone(gateway, victim, first, [{"room": "a"}])
    await gateway.sentinel([{"__id": "USER/1"}], first)


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


async def gone_within(ws: aiohttp.ClientWebSocketResponse, seconds: float) -> float:
    """Read ``ws`` until the gateway closes it; how long that took (fails past ``seconds``)."""
    started = time.monotonic()
    while (await ws.receive(timeout=seconds)).type == aiohttp.WSMsgType.TEXT:
        pass
    return time.monotonic() - started


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


# -- listeners, ids and criteria --------------------------------------------------------------


async def test_id_is_set_so_an_id_audience_reaches_that_listener_only(gateway: Gateway) -> None:
    one = await gateway.jwt_listener("USER/1", {"role": "admin"})
    two = await gateway.jwt_listener("USER/2", {"role": "admin"})
    await gateway.push({"name": "for-one", "audience": [{"__id": "USER/1"}]})
    assert await one.expect("for-one")
    await gateway.sentinel([{"__id": "USER/2"}], two)
    await gateway.sentinel([{"role": "admin"}], one, two)


async def test_id_combines_with_other_predicates(gateway: Gateway) -> None:
    one = await gateway.jwt_listener("USER/1", {"role": "admin"})
    await gateway.push({"name": "wrong-role", "audience": [{"__id": "USER/1", "role": "author"}]})
    await gateway.sentinel([{"__id": "USER/1", "role": "admin"}], one)


async def test_one_id_with_two_sockets_gets_each_message_once_on_each(gateway: Gateway) -> None:
    browser = await gateway.jwt_listener("USER/1", {"room": "a"})
    phone = await gateway.jwt_listener("USER/1", {"room": "a"})
    await gateway.push({"name": "hello", "audience": [{"room": "a"}, {"__id": "USER/1"}]})
    for socket in (browser, phone):
        assert await socket.expect("hello")
    # No second copy: the next event of each is the sentinel.
    await gateway.sentinel([{"__id": "USER/1"}], browser, phone)


async def test_new_criteria_for_an_id_apply_to_all_its_sockets(gateway: Gateway) -> None:
    browser = await gateway.jwt_listener("USER/1", {"room": "a"})
    phone = await gateway.jwt_listener("USER/1", {"room": "a"})
    await gateway.sentinel([{"room": "a"}], browser, phone)
    tablet = await gateway.jwt_listener("USER/1", {"room": "b"})
    await gateway.push({"name": "old-room", "audience": [{"room": "a"}]})
    await gateway.sentinel([{"room": "b"}], browser, phone, tablet)


async def test_closing_one_socket_of_an_id_keeps_its_other_sockets_served(
    gateway: Gateway,
) -> None:
    first = await gateway.jwt_listener("USER/1", {"room": "a"})
    second = await gateway.jwt_listener("USER/1", {"room": "a"})
    await first.close()
    await gateway.sentinel([{"room": "a"}], second)


# -- matching, end to end ---------------------------------------------------------------------


async def test_audience_is_an_or_of_queries(gateway: Gateway) -> None:
    admin = await gateway.jwt_listener("USER/1", {"role": "admin", "blogId": 1})
    author = await gateway.jwt_listener("USER/2", {"role": "author", "blogId": 42})
    other = await gateway.jwt_listener("USER/3", {"role": "author", "blogId": 418})
    audience = [{"role": "admin"}, {"role": "author", "blogId": 42}]
    await gateway.push({"name": "NEW_ARTICLE", "audience": audience})
    assert await admin.expect("NEW_ARTICLE")
    assert await author.expect("NEW_ARTICLE")
    await gateway.sentinel([{"__id": "USER/3"}], other)


async def test_query_is_an_and_of_predicates(gateway: Gateway) -> None:
    author = await gateway.jwt_listener("USER/1", {"role": "author", "blogId": 42})
    await gateway.push({"name": "half", "audience": [{"role": "author", "blogId": 7}]})
    await gateway.push({"name": "missing-key", "audience": [{"role": "author", "team": "x"}]})
    await gateway.sentinel([{"role": "author", "blogId": 42}], author)


async def test_list_criterion_matches_any_value_it_contains(gateway: Gateway) -> None:
    author = await gateway.jwt_listener("USER/1", {"blogId": [42, 418, "x", True]})
    for value in (42, 418, "x", True):
        await gateway.sentinel([{"blogId": value}], author)
    await gateway.push({"name": "not-in-list", "audience": [{"blogId": 7}, {"blogId": 1}]})
    await gateway.sentinel([{"__id": "USER/1"}], author)


async def test_true_does_not_match_one(gateway: Gateway) -> None:
    flagged = await gateway.jwt_listener("USER/1", {"flag": True, "n": 1})
    await gateway.push({"name": "one-for-true", "audience": [{"flag": 1}]})
    await gateway.push({"name": "true-for-one", "audience": [{"n": True}]})
    await gateway.push({"name": "false-for-zero", "audience": [{"flag": False}]})
    await gateway.sentinel([{"flag": True, "n": 1}], flagged)


async def test_string_42_does_not_match_number_42(gateway: Gateway) -> None:
    listener = await gateway.jwt_listener("USER/1", {"n": 42, "s": "42"})
    await gateway.push({"name": "string-for-number", "audience": [{"n": "42"}]})
    await gateway.push({"name": "number-for-string", "audience": [{"s": 42}]})
    await gateway.sentinel([{"n": 42, "s": "42"}], listener)


async def test_42_matches_42_point_0(gateway: Gateway) -> None:
    integer = await gateway.jwt_listener("USER/1", {"n": 42})
    floating = await gateway.jwt_listener("USER/2", {"n": 42.0})
    await gateway.sentinel([{"n": 42.0}], integer, floating)
    await gateway.sentinel([{"n": 42}], integer, floating)


async def test_event_carries_the_payload(serve: Callable[[Bow], Awaitable[Gateway]]) -> None:
    gateway = await serve(plugin_bow(lambda t: {"id": t}, lambda details: {}))
    client = await gateway.listener("USER/1")
    payload = {"title": "é", "nested": {"list": [1, 2.5, None, True]}, "n": 0}
    await gateway.push({"name": "with", "payload": payload, "audience": [{"__id": "USER/1"}]})
    assert await client.expect("with") == payload


async def test_absent_payload_gives_an_event_without_data(
    serve: Callable[[Bow], Awaitable[Gateway]],
) -> None:
    gateway = await serve(plugin_bow(lambda t: {"id": t}, lambda details: {}))
    client = await gateway.listener("USER/1")
    await gateway.push({"name": "bare", "audience": [{"__id": "USER/1"}]})
    assert await client.expect("bare") is NO_DATA


async def test_null_payload_gives_none(serve: Callable[[Bow], Awaitable[Gateway]]) -> None:
    gateway = await serve(plugin_bow(lambda t: {"id": t}, lambda details: {}))
    client = await gateway.listener("USER/1")
    await gateway.push({"name": "null", "payload": None, "audience": [{"__id": "USER/1"}]})
    assert await client.expect("null") is None


async def test_empty_audience_reaches_nobody(gateway: Gateway) -> None:
    client = await gateway.jwt_listener("USER/1")
    await gateway.push({"name": "nobody", "audience": []})
    await gateway.sentinel([{"__id": "USER/1"}], client)


# -- delivery ---------------------------------------------------------------------------------


async def test_messages_arrive_in_order_each_exactly_once(gateway: Gateway) -> None:
    client = await gateway.jwt_listener("USER/1")
    count = 200
    for seq in range(count):
        await gateway.push({"name": "tick", "seq": seq, "audience": [{"__id": "USER/1"}]})
    received = [(await client.expect("tick"))["seq"] for _ in range(count)]
    assert received == list(range(count))
    await gateway.sentinel([{"__id": "USER/1"}], client)


async def test_polling_transport_authenticates_and_receives(gateway: Gateway) -> None:
    client = await gateway.listener(token("USER/1", {"room": "a"}), transports=["polling"])
    assert client.client.transport() == "polling"
    await gateway.push({"name": "over-polling", "n": 1, "audience": [{"room": "a"}]})
    assert (await client.expect("over-polling"))["n"] == 1
    # End the session from the server: python-engineio's polling client that disconnects itself
    # waits for its pending long-poll, which the server answers only at the next ping (25 s).
    await gateway.push({"name": "__disconnect", "audience": [{"room": "a"}]})
    await client.wait_disconnected()


async def test_a_thousand_sockets_all_receive_a_broadcast(gateway: Gateway) -> None:
    count = 1_000
    gate = asyncio.Semaphore(50)
    clients = [Client(gateway.url) for _ in range(count)]

    async def join(position: int, client: Client) -> None:
        async with gate:
            await client.connect("v1.3")
            await client.authenticate_with_ack(token(f"USER/{position}", {"room": "all"}), 30)

    try:
        await asyncio.wait_for(asyncio.gather(*(join(i, c) for i, c in enumerate(clients))), 45)
        await gateway.push({"name": "broadcast", "audience": [{"room": "all"}]})
        await asyncio.wait_for(
            asyncio.gather(*(client.expect("broadcast", 20) for client in clients)), 25
        )
    finally:

        async def leave(client: Client) -> None:
            async with gate:
                await client.close()

        await asyncio.gather(*(leave(client) for client in clients))


async def test_disconnect_message_disconnects_every_matching_socket_only(gateway: Gateway) -> None:
    admin_browser = await gateway.jwt_listener("USER/1", {"role": "admin"})
    admin_phone = await gateway.jwt_listener("USER/1", {"role": "admin"})
    other_admin = await gateway.jwt_listener("USER/2", {"role": "admin", "blogId": 7})
    author = await gateway.jwt_listener("USER/3", {"role": "author", "blogId": 7})
    anonymous = await gateway.connect()
    await gateway.push(
        {"name": "__disconnect", "audience": [{"__id": "USER/1"}, {"role": "admin", "blogId": 7}]}
    )
    for gone in (admin_browser, admin_phone, other_admin):
        await gone.wait_disconnected()
        assert gone.log == ["disconnect"], gone.log  # no __disconnect event, no alert
    await gateway.sentinel([{"blogId": 7}], author)
    assert author.log == ["sentinel-1"]
    assert anonymous.client.connected and anonymous.log == []


async def test_disconnected_listener_can_reconnect_and_receive(gateway: Gateway) -> None:
    first = await gateway.jwt_listener("USER/1", {"role": "admin"})
    await gateway.push({"name": "__disconnect", "audience": [{"__id": "USER/1"}]})
    await first.wait_disconnected()
    again = await gateway.jwt_listener("USER/1", {"role": "admin"})
    await gateway.sentinel([{"role": "admin"}], again)


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


async def raw_websocket_listener(
    http: aiohttp.ClientSession, url: str, listener_token: str
) -> aiohttp.ClientWebSocketResponse:
    """An authenticated socket spoken to in raw Engine.IO/Socket.IO frames, so that a test can
    stop reading from it (offering permessage-deflate, as socket.io-client does)."""
    ws = await http.ws_connect(
        url + "/socket.io/?EIO=4&transport=websocket&v=1.3", compress=15, autoping=False
    )
    assert (await ws.receive_str(timeout=WAIT)).startswith("0{")  # Engine.IO open
    await ws.send_str("40")  # Socket.IO connect to "/"
    assert (await ws.receive_str(timeout=WAIT)).startswith("40{")
    await ws.send_str(f'421["authenticate","{listener_token}"]')
    assert await ws.receive_str(timeout=WAIT) == "431[]"  # the acknowledgement
    return ws


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


async def metric(gateway: Gateway, sample: str) -> float:
    return await read_metric(gateway.http, gateway.url, sample)


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
