"""The contract every client protocol of the gateway passes: admission, the codes of section 10
(``bow_gateway/core/codes.py``), kicks, and (for the protocols that have them) recovery and the
incoming-frame rule, each checked end to end on a real gateway with the protocol's real client.

A protocol passes it with one ``Test...`` class in a test module, deriving from
:class:`ProtocolContract` (and :class:`RecoveryContract`, :class:`IncomingContract` where they
apply), that supplies an *adapter*: ``protocol`` (a name) and :meth:`ProtocolContract.connect`.
The suite holds no branch per protocol; the adapter's duties are:

- ``connect(url, token, *, version="v1")`` opens one connection of its protocol to the gateway at
  ``url`` for outbound ``version`` with ``token`` (a JWT whose ``sub`` is the listener id and whose
  ``criteria`` claim its criteria; None: no token), subscribed to every name under ``contract/``
  (``contract/#``, or however the protocol spells it, where connections are strictly subscribed),
  and returns once the gateway holds it as a listener (:meth:`_Suite.held` waits for that where
  the protocol shows no sign of it) or once the gateway refused it;
- the :class:`ContractClient` it returns gives each message delivered as ``(name, payload)``
  (what the protocol adds of its own, its notices, its position reminders, skipped), the code
  of section 10 the gateway refused or closed it with (however the protocol tells it: an
  ``alert``'s info, a refusal's JSON body, a close frame's code), and closes;
- :class:`IncomingContract`: the client also has ``flood()``, which sends frames past the rule
  every protocol holds its clients to (100 at once, then 20 a second) without waiting for
  answers;
- :class:`RecoveryContract`: ``resume(url, token, since)`` connects again, as ``connect`` does,
  asking for every message after position ``since`` (a ``Bow-Position`` the client received).

Over a plain WebSocket, :func:`flood_websocket` and :func:`close_code` are ``flood()`` and most
of ``closed()``. Messages are envelopes (``{name, payload, audience}``); payloads are JSON
objects, never strings.
Config overrides per test go through :meth:`_Suite.serve`; :meth:`_Suite.config` and
:meth:`_Suite.build` are the hooks for a protocol that needs a gateway of its own.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar, Protocol, runtime_checkable

import aiohttp
import pytest
from bow_gateway.outbounds.jwt import mint

from bow_gateway import Bow

from . import AUTH, PATH, WAIT, base_config, token, until
from .mixed_clients import mixed_bow

LISTENER = "CONTRACT/1"
OWN = {"team": "a"}
TO_OWN = [OWN]
TO_OTHERS = [{"team": "b"}]
OTHER_SECRET = "another-secret-that-is-at-least-32-bytes-long"


@runtime_checkable
class ContractClient(Protocol):
    """One connection, as the suite sees it through its adapter."""

    async def receive(self, timeout: float = WAIT) -> tuple[str, Any]:
        """The next message delivered: its name and payload."""
        ...

    async def closed(self, timeout: float = WAIT) -> int:
        """The code (4xxx) the gateway refused or closed this connection with."""
        ...

    async def close(self) -> None:
        """Close it from the client's side (also when refused or closed already)."""
        ...


@runtime_checkable
class FloodingClient(ContractClient, Protocol):
    """A client whose protocol lets it send frames (:class:`IncomingContract`)."""

    async def flood(self) -> None:
        """Send frames past the incoming rule, as fast as the connection takes them."""
        ...


class ContractGateway:
    """The running gateway the suite talks to: pushes, kicks, its listeners, its stop."""

    def __init__(self, bow: Bow, http: aiohttp.ClientSession) -> None:
        self.bow = bow
        self.url = f"http://127.0.0.1:{bow.port}"
        self.http = http

    async def push(self, name: str, payload: Any, audience: list[dict[str, Any]]) -> str:
        """POST one envelope to the inbound; its ``Bow-Position``."""
        body = {"name": name, "payload": payload, "audience": audience}
        async with self.http.post(self.url + PATH, json=body, headers=AUTH) as response:
            text = await response.text()
            assert response.status == 204, f"push refused: {response.status} {text}"
            position: str = response.headers["Bow-Position"]
        return position

    async def kick(self, listener_id: str, reason: str) -> None:
        """``POST /_bow/disconnect`` (the control API) for one listener id."""
        body = {"ids": [listener_id], "reason": reason}
        url = self.url + "/_bow/disconnect"
        async with self.http.post(url, json=body, headers=AUTH) as response:
            assert response.status == 204, await response.text()

    def listeners(self) -> int:
        """How many connections the gateway holds as listeners (in its index)."""
        outbound = self.bow._outbound
        assert outbound is not None
        return outbound.listener_count()

    async def stop(self) -> None:
        await self.bow.stop()


class _Suite(abc.ABC):
    """What the contract's parts share: the gateway each test starts, its clients (closed at
    the end, before the gateway stops), and the adapter's method."""

    protocol: ClassVar[str]
    http: aiohttp.ClientSession
    _gateway: ContractGateway | None
    _clients: list[ContractClient]
    _start_bow: Callable[[Bow], Awaitable[Bow]]

    @pytest.fixture(autouse=True)
    async def _contract_session(
        self, start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
    ) -> AsyncIterator[None]:
        self._start_bow, self.http = start_bow, http
        self._gateway, self._clients = None, []
        yield
        await asyncio.gather(*(client.close() for client in self._clients))

    @abc.abstractmethod
    async def connect(self, url: str, token: str | None, *, version: str = "v1") -> ContractClient:
        """The adapter: a connection of this protocol, held as a listener or refused."""

    def config(self, **outbound: Any) -> dict[str, Any]:
        """The gateway's configuration, ``outbound`` overriding settings of its section."""
        return base_config(outbound={"timeout": 5, **outbound})

    def build(self, config: dict[str, Any]) -> Bow:
        """The gateway: one outbound ``v1`` (JWT, criteria from the claim), envelopes in."""
        return mixed_bow(config)

    async def serve(self, **outbound: Any) -> ContractGateway:
        """Start this test's gateway, with ``outbound`` overrides (``max_sockets_per_id=1``)."""
        bow = await self._start_bow(self.build(self.config(**outbound)))
        self._gateway = ContractGateway(bow, self.http)
        return self._gateway

    @property
    def gateway(self) -> ContractGateway:
        assert self._gateway is not None, "serve() first"
        return self._gateway

    async def listen(self, listener_token: str | None, *, version: str = "v1") -> ContractClient:
        """A connection through the adapter (closed at the end of the test)."""
        client = await self.connect(self.gateway.url, listener_token, version=version)
        assert isinstance(client, ContractClient), client
        self._clients.append(client)
        return client

    async def held(self, before: int) -> None:
        """Until the gateway holds more than ``before`` listeners: for an adapter whose protocol
        shows no sign of it."""
        await until(lambda: self.gateway.listeners() > before, "the connection held")

    async def expect(self, client: ContractClient, name: str, payload: Any) -> None:
        """The next message ``client`` receives must be ``name`` with ``payload``."""
        assert await client.receive() == (name, payload)


class ProtocolContract(_Suite):
    """What every protocol does: admission, refusals and closes with their codes."""

    async def test_a_listener_receives_a_message_addressed_to_its_criteria(self) -> None:
        gateway = await self.serve()
        client = await self.listen(token(LISTENER, OWN))
        await gateway.push("contract/greeting", {"text": "hello"}, TO_OWN)
        await self.expect(client, "contract/greeting", {"text": "hello"})

    async def test_a_message_to_another_audience_is_not_delivered(self) -> None:
        gateway = await self.serve()
        client = await self.listen(token(LISTENER, OWN))
        await gateway.push("contract/theirs", {"n": 1}, TO_OTHERS)
        await gateway.push("contract/ours", {"n": 2}, TO_OWN)
        await self.expect(client, "contract/ours", {"n": 2})

    async def test_a_listener_counts_while_connected_and_not_after_it_closes(self) -> None:
        gateway = await self.serve()
        client = await self.listen(token(LISTENER, OWN))
        assert gateway.listeners() == 1
        await client.close()
        await until(lambda: gateway.listeners() == 0, "the listener let go")

    async def test_a_token_with_a_bad_signature_is_refused_with_4002(self) -> None:
        gateway = await self.serve()
        client = await self.listen(mint(LISTENER, OTHER_SECRET, criteria=OWN))
        assert await client.closed() == 4002
        assert gateway.listeners() == 0

    async def test_an_unknown_outbound_version_is_refused_with_4020(self) -> None:
        gateway = await self.serve()
        client = await self.listen(token(LISTENER, OWN), version="nope")
        assert await client.closed() == 4020
        assert gateway.listeners() == 0

    async def test_a_connection_past_max_sockets_per_id_is_refused_with_4009(self) -> None:
        gateway = await self.serve(max_sockets_per_id=1)
        first = await self.listen(token(LISTENER, OWN))
        second = await self.listen(token(LISTENER, OWN))
        assert await second.closed() == 4009
        await gateway.push("contract/still", {"n": 1}, TO_OWN)  # the older one stays
        await self.expect(first, "contract/still", {"n": 1})

    async def test_a_token_whose_exp_passes_is_closed_with_4003(self) -> None:
        await self.serve(expiry_grace=0)
        client = await self.listen(token(LISTENER, OWN, ttl=2))
        assert await client.closed(timeout=WAIT) == 4003

    async def test_stopping_the_gateway_closes_with_4012(self) -> None:
        gateway = await self.serve()
        client = await self.listen(token(LISTENER, OWN))
        stopping = asyncio.create_task(gateway.stop())
        assert await client.closed() == 4012
        await stopping

    async def test_a_kick_through_the_control_api_closes_with_4005(self) -> None:
        gateway = await self.serve()
        client = await self.listen(token(LISTENER, OWN))
        await gateway.kick(LISTENER, "contract")
        assert await client.closed() == 4005
        await until(lambda: gateway.listeners() == 0, "the kicked listener let go")


class RecoveryContract(_Suite):
    """For protocols with positions: a client that comes back with its last one misses
    nothing."""

    @abc.abstractmethod
    async def resume(self, url: str, token: str, since: str) -> ContractClient:
        """The adapter: connect again, asking for every message after position ``since``."""

    async def test_reconnecting_with_the_last_position_receives_the_missed_messages_in_order(
        self,
    ) -> None:
        gateway = await self.serve()
        listener = token(LISTENER, OWN)
        client = await self.listen(listener)
        since = await gateway.push("contract/seen", {"n": 0}, TO_OWN)
        await self.expect(client, "contract/seen", {"n": 0})
        await client.close()
        await until(lambda: gateway.listeners() == 0, "the listener let go")
        await gateway.push("contract/missed", {"n": 1}, TO_OWN)
        await gateway.push("contract/theirs", {"n": 2}, TO_OTHERS)
        await gateway.push("contract/missed", {"n": 3}, TO_OWN)
        await gateway.push("contract/missed", {"n": 4}, TO_OWN)
        again = await self.resume(gateway.url, listener, since)
        self._clients.append(again)
        for n in (1, 3, 4):
            await self.expect(again, "contract/missed", {"n": n})
        await gateway.push("contract/live", {"n": 5}, TO_OWN)
        await self.expect(again, "contract/live", {"n": 5})


class IncomingContract(_Suite):
    """For protocols whose clients send frames: past the incoming rule, 4011."""

    async def test_flooding_frames_past_the_incoming_rate_closes_with_4011(self) -> None:
        gateway = await self.serve()
        client = await self.listen(token(LISTENER, OWN))
        assert isinstance(client, FloodingClient), f"{client!r} has no flood()"
        await client.flood()
        assert await client.closed() == 4011
        await until(lambda: gateway.listeners() == 0, "the flooding listener let go")


FLOOD_FRAMES = 300  # past the burst of 100, sent within a fraction of a second


async def flood_websocket(websocket: aiohttp.ClientWebSocketResponse, frame: str) -> None:
    """Send ``frame`` :data:`FLOOD_FRAMES` times, stopping once the gateway closed (what it
    sends back is left to be read by ``closed()``)."""
    try:
        for _ in range(FLOOD_FRAMES):
            if websocket.closed:
                return
            await websocket.send_str(frame)
    except (ConnectionError, aiohttp.ClientError):
        pass  # closed meanwhile


async def close_code(websocket: aiohttp.ClientWebSocketResponse, timeout: float = WAIT) -> int:
    """Read (and drop) what comes until the gateway closes ``websocket``: its close code."""
    async with asyncio.timeout(timeout):
        while True:
            message = await websocket.receive()
            if message.type in _ENDS:
                code = websocket.close_code
                assert code is not None, f"closed without a code: {message!r}"
                return code


_ENDS = frozenset({aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR})
