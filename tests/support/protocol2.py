"""Protocol 2 (docs/protocol-2.md) in the tests: a python-socketio client that keeps every event
(:class:`P2`), a gateway that speaks it on a free port, an admin's listener, and what the tests
of its recovery, authentication and instances share."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

import socketio
from bow_gateway.inbounds.passthrough import create_message_from_envelope
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound

from bow_gateway import Bow

from . import AUTH, PATH, SECRET, WAIT, Gateway, token

AUTHOR = {"role": "author", "blogId": 42}
BLOG_42 = [{"blogId": 42}]
BLOG_7 = [{"blogId": 7}]
WATCHER = "WATCHER"
ID = re.compile(r"[A-Za-z0-9_-]{12}[0-9a-f]+")
"""A message id as this gateway makes them (:mod:`bow_gateway.core.message_ids`)."""


def without_id(meta: Any) -> Any:
    """A message event's ``meta`` without its ``id``, which must be there (section 16): for the
    tests that read events off the wire themselves and compare ``meta`` as section 6 has it."""
    assert isinstance(meta, dict), meta
    message_id = meta.get("id")
    assert isinstance(message_id, str) and ID.fullmatch(message_id), meta
    return {key: value for key, value in meta.items() if key != "id"}


class P2:
    """A python-socketio client that keeps every event with all its arguments, in order, with
    the time each arrived (and when it was disconnected)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = socketio.AsyncClient(reconnection=False)
        self.events: asyncio.Queue[tuple[str, tuple[Any, ...]]] = asyncio.Queue()
        self.log: list[tuple[str, tuple[Any, ...], float]] = []
        self.disconnected = asyncio.Event()
        self.disconnected_at: float | None = None
        self.ids: list[str] = []  # each message event's meta.id, in order
        self.client.on("*", self._on_any)
        self.client.on("disconnect", self._on_disconnect)

    async def _on_any(self, event: str, *args: Any) -> None:
        args = self._without_id(event, args)
        self.log.append((event, args, time.monotonic()))
        self.events.put_nowait((event, args))

    def _without_id(self, event: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """A message's ``(payload, meta)`` with ``meta.id`` checked (section 16: every message
        event has one, a gateway-made id) and kept in :attr:`ids`, out of ``meta``: the tests of
        sections 6-15 compare ``meta`` as those sections have it; those of section 16 read ids."""
        if event in ("__position", "__gap", "alert") or len(args) != 2:
            return args
        payload, meta = args
        if not isinstance(meta, dict):
            return args
        message_id = meta.get("id")
        assert isinstance(message_id, str) and ID.fullmatch(message_id), (event, meta)
        self.ids.append(message_id)
        return payload, {key: value for key, value in meta.items() if key != "id"}

    async def _on_disconnect(self, *args: Any) -> None:
        self.disconnected_at = time.monotonic()
        self.log.append(("disconnect", (), self.disconnected_at))
        self.disconnected.set()

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.log]

    @property
    def alerts(self) -> list[tuple[Any, ...]]:
        return [args for name, args, _ in self.log if name == "alert"]

    async def connect(
        self, proto: str | None = "2", version: str = "v1.3", transport: str = "websocket"
    ) -> P2:
        """Connect over ``transport`` alone (``websocket``, or ``polling``: long-polling)."""
        query = f"?v={version}" + ("" if proto is None else f"&proto={proto}")
        await self.client.connect(self.url + query, transports=[transport], wait_timeout=WAIT)
        return self

    async def authenticate(self, listener_token: Any, options: Any = None) -> Any:
        """``authenticate`` with an acknowledgement; the ack's result (protocol 1: None)."""
        data = (listener_token,) if options is None else (listener_token, options)
        return await self.client.call("authenticate", data, timeout=WAIT)

    async def authenticate_unacked(self, listener_token: Any, options: Any = None) -> list[Any]:
        """``authenticate`` with an acknowledgement that may never come: what it received."""
        acks: list[Any] = []
        data = (listener_token,) if options is None else (listener_token, options)
        await self.client.emit("authenticate", data, callback=lambda *args: acks.append(args))
        return acks

    async def next(self, timeout: float = WAIT) -> tuple[str, tuple[Any, ...]]:
        return await asyncio.wait_for(self.events.get(), timeout)

    async def expect(self, name: str, timeout: float = WAIT) -> tuple[Any, ...]:
        """The next event must be ``name``: its arguments."""
        event, args = await self.next(timeout)
        assert event == name, f"expected {name!r}, got {event!r} with {args!r}"
        return args

    async def wait_disconnected(self, timeout: float = WAIT) -> None:
        await asyncio.wait_for(self.disconnected.wait(), timeout)

    async def close(self) -> None:
        await self.client.disconnect()


class P2Gateway:
    """A running gateway seen from outside: pushes that return their ``Bow-Position``, protocol-2
    clients (closed at the end), and a watcher that shows when the gateway has delivered
    everything pushed so far."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.bow = gateway.bow
        self.url = gateway.url
        self.http = gateway.http
        self.clients: list[P2] = []
        self.watcher: P2 | None = None
        self._settled = 0

    async def push(self, body: Any) -> str:
        """POST a message; its ``Bow-Position``."""
        async with self.http.post(self.url + PATH, json=body, headers=AUTH) as response:
            text = await response.text()
            assert response.status == 204, f"push refused: {response.status} {text}"
            position = response.headers["Bow-Position"]
        assert isinstance(position, str) and position and position.isascii()
        return position

    async def connect(self, proto: str | None = "2") -> P2:
        client = P2(self.url)
        self.clients.append(client)
        return await client.connect(proto)

    async def listener(
        self, listener_token: Any, options: Any = None, proto: str | None = "2"
    ) -> tuple[P2, Any]:
        """A connected socket, authenticated: the client and its ack's result."""
        client = await self.connect(proto)
        return client, await client.authenticate(listener_token, options)

    async def watch(self) -> None:
        """Connect the watcher (before what it must see)."""
        self.watcher, _ = await self.listener(token(WATCHER))

    async def settle(self) -> str:
        """Push a message to the watcher only and wait for it: everything pushed before has been
        delivered (and is in the recovery window). Its position."""
        assert self.watcher is not None
        self._settled += 1
        name = f"settled-{self._settled}"
        position = await self.push({"name": name, "audience": [{"__id": WATCHER}]})
        while (event := await self.watcher.next())[0] == "__position":
            pass  # the watcher may be quiet long enough to be told one
        assert event == (name, (None, {"position": position})), event
        return position

    async def sentinel(self, audience: list[dict[str, Any]], *clients: P2) -> str:
        """Push a message to ``audience``; each of ``clients`` must see it as its next event,
        live. Its position."""
        self._settled += 1
        name = f"sentinel-{self._settled}"
        position = await self.push({"name": name, "audience": audience})
        for client in clients:
            assert await client.expect(name) == (None, {"position": position})
        return position

    async def close(self) -> None:
        await asyncio.gather(*(client.close() for client in self.clients))


def p2_bow(
    config: dict[str, Any],
    *,
    listener_fn: Callable[[Any], Any] | None = None,
    anonymous_criteria: dict[str, Any] | None = None,
) -> Bow:
    """A gateway whose messages are envelopes (name, payload, audience): the JWT outbound v1.3
    (or ``listener_fn``), criteria from the details' ``criteria`` claim."""
    return (
        Bow(config)
        .middleware(version="v1.1", create_criteria_from_listener_details=criteria_from_claim())
        .inbound(
            path=PATH,
            create_message_from_request_body=create_message_from_envelope,
            middleware_version="v1.1",
        )
        .outbound(
            version="v1.3",
            create_listener_details_from_token=listener_fn or JwtOutbound(secret=SECRET),
            middleware_version="v1.1",
            anonymous_criteria=anonymous_criteria,
        )
    )


INFO_KEYS = {"code", "reason", "fatal", "reconnect"}


def info_of(alert: tuple[Any, ...]) -> dict[str, Any]:
    """A protocol-2 alert is ``(text, info)``: its info (the text checked on the way)."""
    text, info = alert
    assert isinstance(text, str) and text
    assert isinstance(info, dict) and set(info) == INFO_KEYS, info
    return info


async def closed_with(client: P2, code: int) -> dict[str, Any]:
    """``client`` gets a fatal ``alert`` with ``code`` as its last event, then a disconnect
    within 1 s of it: the alert's info."""
    await client.wait_disconnected()
    (name, alert, at), (last, _, gone) = client.log[-2:]
    assert (name, last) == ("alert", "disconnect"), client.names
    info = info_of(alert)
    assert info["code"] == code and info["fatal"] is True, info
    assert gone - at < 1.0, gone - at
    assert not client.client.connected
    return info


def stream_key(position: str) -> tuple[str, int, int]:
    """The Redis backplane's ``{epoch}.{ms}-{seq}`` (docs/redis.md), to sort the 204s' positions:
    only the test parses positions."""
    epoch, _, entry = position.partition(".")
    milliseconds, _, sequence = entry.partition("-")
    return epoch, int(milliseconds), int(sequence)


class Listener:
    """A protocol-2 socket of an admin: each event with its data and ``meta``, in order."""

    def __init__(self) -> None:
        self.client = socketio.AsyncClient(reconnection=False)
        self.events: asyncio.Queue[tuple[str, tuple[Any, ...]]] = asyncio.Queue()
        self.client.on("*", self._on_any)

    async def _on_any(self, event: str, *args: Any) -> None:
        if event != "__position":  # a quiet socket's position reminder
            self.events.put_nowait((event, args))

    async def connect(self, url: str) -> Listener:
        await self.client.connect(
            f"{url}?v=v1.3&proto=2", transports=["websocket"], wait_timeout=WAIT
        )
        await self.client.call("authenticate", (token("ADMIN", {"role": "admin"}),), timeout=WAIT)
        return self

    async def next(self) -> tuple[str, tuple[Any, ...]]:
        return await asyncio.wait_for(self.events.get(), WAIT)
