"""One gateway seen through all its protocols at once: Socket.IO (python-socketio, protocol 1 or
2), Server-Sent Events (aiohttp's client reading the stream) and Flywheel (the client written
from the seed alone), for the tests of ``clients.md`` sections 11-13 and 15 across protocols
(``test_protocols_together.py``, ``test_protocols_instances.py``,
``test_enrichers_publish.py``).

Every client is normalised to what it received, in order, as ``(name, payload, position)``
(``position`` is ``None`` where the protocol carries none: Flywheel, Socket.IO protocol 1), so
that the sequences of different protocols can be compared.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
from bow_gateway.inbounds.passthrough import create_message_from_envelope
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound

from bow_gateway import Bow

from . import AUTH, PATH, SECRET, WAIT, token, until
from .flywheel_client import FlywheelClient
from .protocol2 import P2
from .sse_client import Stream

VERSION: Final = "v1"
FX: Final = {"desk": "fx"}
EQ: Final = {"desk": "eq"}
TO_FX: Final = [FX]
TO_EQ: Final = [EQ]

Client = P2 | Stream | FlywheelClient
Seen = tuple[str, Any, str | None]


def publish_to_own_desk(details: Mapping[str, Any] | None, topic: str, body: str) -> dict[str, Any]:
    """A ``create_message_from_publish`` hook that sets the audience: the publisher's own desk
    (from its token's criteria). Refused when anonymous, or when the topic is not a quote."""
    if details is None:
        raise PermissionError("anonymous listeners do not publish")
    if not topic.startswith("quotes/"):
        raise PermissionError(f"no publishing on {topic}")
    desk = details["claims"]["criteria"]["desk"]
    return {"name": topic, "payload": json.loads(body), "audience": [{"desk": desk}]}


def mixed_bow(config: dict[str, Any], **outbound: Any) -> Bow:
    """A gateway serving one outbound (``v1``: JWT, criteria from the ``criteria`` claim, the
    publish hook :func:`publish_to_own_desk`) over Socket.IO, SSE and Flywheel; messages are
    envelopes (name, payload, audience)."""
    outbound.setdefault("create_message_from_publish", publish_to_own_desk)
    return (
        Bow(config)
        .middleware(version="v1", create_criteria_from_listener_details=criteria_from_claim())
        .inbound(
            path=PATH,
            create_message_from_request_body=create_message_from_envelope,
            middleware_version="v1",
        )
        .outbound(
            version=VERSION,
            create_listener_details_from_token=JwtOutbound(secret=SECRET),
            middleware_version="v1",
            **outbound,
        )
    )


def bearer(listener_id: str, criteria: dict[str, Any]) -> dict[str, str]:
    return {"type": "Bearer", "token": token(listener_id, criteria)}


class Mixed:
    """One running gateway (instance): pushes that return their ``Bow-Position``, and clients of
    every protocol, each connected and held as a listener when returned (closed by
    :meth:`close`)."""

    def __init__(self, name: str, bow: Bow, http: aiohttp.ClientSession) -> None:
        self.name = name
        self.bow = bow
        self.url = f"http://127.0.0.1:{bow.port}"
        self.http = http
        self._socketio: list[P2] = []
        self._streams: list[aiohttp.ClientResponse] = []
        self._flywheels: list[FlywheelClient] = []

    async def push(self, body: Any) -> str:
        async with self.http.post(self.url + PATH, json=body, headers=AUTH) as response:
            text = await response.text()
            assert response.status == 204, f"push to {self.name}: {response.status} {text}"
            position: str = response.headers["Bow-Position"]
        return position

    async def socketio(
        self, listener_id: str, criteria: dict[str, Any], *, proto: str | None = "2"
    ) -> P2:
        """A Socket.IO socket (protocol 2, or 1 with ``proto=None``), authenticated (its ack
        received)."""
        client = P2(self.url)
        self._socketio.append(client)
        await client.connect(proto, version=VERSION)
        ack = await client.authenticate(token(listener_id, criteria))
        assert proto is None or ack["id"] == listener_id, ack
        return client

    async def subscribe(self, client: P2, request: Any) -> Any:
        """``subscribe`` on a protocol-2 socket; the ack's result."""
        return await client.client.call("subscribe", request, timeout=WAIT)

    async def sse(
        self, listener_id: str, criteria: dict[str, Any], topics: list[str] | tuple[str, ...] = ()
    ) -> Stream:
        """An SSE stream with ``topics`` as its filters, held by the gateway when returned."""
        held = self.listeners()
        response = await self.open_sse(token(listener_id, criteria), topics)
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"] == "text/event-stream"
        await until(lambda: self.listeners() > held, f"the stream held on {self.name}")
        return Stream(response)

    async def open_sse(
        self, listener_token: str, topics: list[str] | tuple[str, ...] = ()
    ) -> aiohttp.ClientResponse:
        """``GET /events`` (the response, whatever its status; closed by :meth:`close`)."""
        response = await self.http.get(
            self.url + "/events",
            params=[("v", VERSION), *(("topic", topic) for topic in topics)],
            headers={"Authorization": f"Bearer {listener_token}"},
        )
        self._streams.append(response)
        return response

    async def flywheel(
        self,
        listener_id: str,
        criteria: dict[str, Any],
        *,
        subscribe: list[str] | tuple[str, ...] = (),
        session: str | None = None,
    ) -> FlywheelClient:
        """A Flywheel connection bound (with a Bearer token, ``subscribe``, ``sessionId``),
        its BindResponse without errors."""
        client = await self.open_flywheel()
        bind: dict[str, Any] = {"auth": bearer(listener_id, criteria), "subscribe": list(subscribe)}
        if session is not None:
            bind["sessionId"] = session
        response = await client.bind(**bind)
        assert response["errors"] == [], response
        return client

    async def open_flywheel(self) -> FlywheelClient:
        client = await FlywheelClient.open(self.http, self.url, path=f"/broker?v={VERSION}")
        self._flywheels.append(client)
        return client

    def listeners(self) -> int:
        outbound = self.bow._outbound
        assert outbound is not None
        return outbound.listener_count()

    async def close(self) -> None:
        await asyncio.gather(*(client.close() for client in self._socketio))
        await asyncio.gather(*(client.close() for client in self._flywheels))
        for response in self._streams:
            response.close()


async def next_seen(client: Client, timeout: float = WAIT) -> Seen:
    """The next message ``client`` received: ``(name, payload, position)``."""
    if isinstance(client, P2):
        name, args = await client.next(timeout)
        assert name not in ("__position", "__gap", "alert"), (name, args)
        if len(args) == 2:  # protocol 2: payload, {"position"}
            assert set(args[1]) == {"position"}, args  # live, not replayed (P2 keeps ids apart)
            return name, args[0], args[1]["position"]
        return name, (args[0] if args else None), None
    if isinstance(client, Stream):
        event = await client.next(timeout)
        assert set(event) == {"id", "event", "data"}, event
        return event["event"], json.loads(event["data"]), event["id"]
    topic, body = await client.receive(timeout)  # the tests' payloads are never strings
    return topic, (json.loads(body) if body else None), None


async def seen_until(client: Client, last: str) -> list[Seen]:
    """Everything ``client`` receives up to the message named ``last``, that one excluded."""
    seen: list[Seen] = []
    while (message := await next_seen(client))[0] != last:
        seen.append(message)
    return seen


def without_positions(seen: list[Seen]) -> list[tuple[str, Any]]:
    return [(name, payload) for name, payload, _ in seen]
