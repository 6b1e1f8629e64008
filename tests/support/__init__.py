"""Helpers shared by the tests: the quick-start gateway, tokens, a recording listener, polling."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import socketio
from bow_gateway.inbounds.passthrough import (
    create_message_from_envelope,
    create_message_from_request_body,
)
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound, mint

from bow_gateway import Bow
from bow_gateway.backplanes import Backplane

ROOT = Path(__file__).resolve().parents[2]  # the repository's root
SECRET = "a-test-secret-that-is-at-least-32-bytes-long"
USER, PASSWORD, REALM = "pusher", "s3cret-pusher", "Test platform"
PATH = "/v1.2/messages"
AUTH = {"Authorization": aiohttp.encode_basic_auth(USER, PASSWORD)}
MAX_HEADER = 65_536  # what the tests' clients read of a header: a batch's Bow-Message-Ids


def token(listener_id: str, criteria: dict[str, Any] | None = None, **kwargs: Any) -> str:
    minted: str = mint(listener_id, SECRET, criteria=criteria or {}, **kwargs)
    return minted


def base_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "port": 0,
        "host": "127.0.0.1",
        "inbound": {"realm": REALM, "username": USER, "password": PASSWORD},
        "outbound": {"timeout": 5},
        "middleware": {"log_interval": None},
    }
    config.update(overrides)
    return config


def standard_bow(
    config: dict[str, Any] | None = None,
    backplane: Backplane | None = None,
    *,
    criteria: Callable[[Any], Any] | None = None,
) -> Bow:
    """The quick-start gateway: JWT outbound v1.3, claims middleware v1.1 (or ``criteria``),
    pass-through inbound."""
    return (
        Bow(config or base_config(), backplane=backplane)
        .middleware(
            version="v1.1",
            create_criteria_from_listener_details=(
                criteria if criteria is not None else criteria_from_claim()
            ),
        )
        .inbound(
            path=PATH,
            create_message_from_request_body=create_message_from_request_body,
            middleware_version="v1.1",
        )
        .outbound(
            version="v1.3",
            create_listener_details_from_token=JwtOutbound(secret=SECRET),
            middleware_version="v1.1",
        )
    )


class Listener:
    """A real python-socketio client that records every event it receives."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = socketio.AsyncClient(reconnection=False)
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.alerts: list[Any] = []
        self.disconnected = asyncio.Event()
        self.client.on("*", self._on_any)
        self.client.on("disconnect", self._on_disconnect)

    async def _on_any(self, event: str, *data: Any) -> None:
        if event == "alert":
            self.alerts.append(data[0] if data else None)
        self.events.put_nowait((event, data[0] if data else _NO_DATA))

    async def _on_disconnect(self, *args: Any) -> None:
        self.disconnected.set()

    async def connect(self, version: str | None = "v1.3", **kwargs: Any) -> None:
        url = self.url if version is None else f"{self.url}?v={version}"
        kwargs.setdefault("transports", ["websocket"])
        await self.client.connect(url, wait_timeout=5, **kwargs)

    async def authenticate(self, listener_token: Any) -> Any:
        return await self.client.call("authenticate", listener_token, timeout=5)

    async def next_event(self, timeout: float = 5.0) -> tuple[str, Any]:
        return await asyncio.wait_for(self.events.get(), timeout)

    async def no_event(self, within: float = 0.3) -> None:
        await asyncio.sleep(within)
        assert self.events.empty(), f"unexpected event {self.events.get_nowait()!r}"

    async def close(self) -> None:
        if self.client.connected:
            await self.client.disconnect()


class _NoData:
    def __repr__(self) -> str:
        return "<no data>"


_NO_DATA = _NoData()
NO_DATA: Any = _NO_DATA


async def read_metric(http: aiohttp.ClientSession, url: str, sample: str) -> float:
    """The value of one sample of ``GET /metrics`` (``0.0`` when absent)."""
    async with http.get(url + "/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith(sample + " "):
                return float(line.split()[-1])
    return 0.0


def short_heartbeats(bow: Bow) -> None:
    """Engine.IO pings every second, answered within one (the default is 25 s and 20 s)."""
    eio = bow._outbound.sio.eio  # type: ignore[union-attr]
    eio.ping_interval, eio.ping_timeout = 1, 1


async def until(
    condition: Callable[[], object], what: str = "a condition", *, timeout: float = 5.0
) -> None:
    """Poll ``condition`` every 10 ms until it holds; after ``timeout`` s, fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}")
        await asyncio.sleep(0.01)


# -- the outbound tests' layer: a gateway and its clients, in order --------------------------------
#
# Absence of a delivery is shown without sleeping where possible: a *sentinel* message is pushed
# after the one that must not arrive, and since delivery is in order, the sentinel must be the
# next event the socket sees.

WAIT = 5.0  # seconds any single expected thing may take before the test fails
CRITERIA_FROM_CLAIM = criteria_from_claim()


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


async def gone_within(ws: aiohttp.ClientWebSocketResponse, seconds: float) -> float:
    """Read ``ws`` until the gateway closes it; how long that took (fails past ``seconds``)."""
    started = time.monotonic()
    while (await ws.receive(timeout=seconds)).type == aiohttp.WSMsgType.TEXT:
        pass
    return time.monotonic() - started


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


async def metric(gateway: Gateway, sample: str) -> float:
    return await read_metric(gateway.http, gateway.url, sample)


def jwt_config_file(folder: Path, secret: str, *, middleware_version: str = "v1") -> str:
    """A standalone config file in ``folder`` (port 0, an outbound timeout of 5 s): the claims
    middleware v1 and a JWT outbound v1 checking ``secret``, naming ``middleware_version``; its
    path."""
    config = folder / "gateway.toml"
    config.write_text(
        f"""
        port = 0
        host = "127.0.0.1"
        [inbound]
        realm = "r"
        username = "u"
        password = "a-password-of-our-own"
        [outbound]
        timeout = 5
        [[middlewares]]
        version = "v1"
        create_criteria_from_listener_details = "bow_gateway.middlewares.claims:criteria_from_claim"
        [[outbounds]]
        version = "v1"
        create_listener_details_from_token = "bow_gateway.outbounds.jwt:JwtOutbound"
        options = {{ secret = "{secret}" }}
        middleware_version = "{middleware_version}"
        """
    )
    return str(config)
