"""The protocol contract (:mod:`.support.protocol_contract`) run by the four built-in protocols:
Socket.IO protocol 2, Server-Sent Events, Flywheel and Gobbler, each through a small adapter
over the tests' own client of that protocol."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import socketio

from .support import WAIT, until
from .support.flywheel_client import FlywheelClient
from .support.gobbler_client import GobblerClient, GobblerMessage, parse
from .support.protocol2 import P2, info_of
from .support.protocol_contract import (
    ContractClient,
    IncomingContract,
    ProtocolContract,
    RecoveryContract,
    close_code,
    flood_websocket,
)
from .support.sse_client import Stream

# -- Socket.IO, protocol 2 ------------------------------------------------------------------------


class SocketIOClient:
    """A protocol-2 socket: codes from its last ``alert``'s info, or its ``connect_error``."""

    def __init__(self, url: str) -> None:
        self.p2 = P2(url)
        self.refused: dict[str, Any] | None = None
        self.p2.client.on("connect_error", self._on_connect_error)

    async def _on_connect_error(self, data: Any) -> None:
        self.refused = data["data"]

    async def open(self, token: str | None, version: str, options: dict[str, Any]) -> Any:
        """Connect, then ``authenticate``: its ack's result once acknowledged, or None once
        refused (at the connect, or with an alert and a disconnect)."""
        try:
            await self.p2.connect("2", version=version)
        except socketio.exceptions.ConnectionError:
            return None
        acks: list[Any] = []
        await self.p2.client.emit("authenticate", (token, options), callback=acks.append)
        await until(lambda: acks or self.p2.disconnected.is_set(), "authenticate answered")
        return acks[0] if acks else None

    async def receive(self, timeout: float = WAIT) -> tuple[str, Any]:
        while (event := await self.p2.next(timeout))[0].startswith("__"):
            pass  # __position reminders
        name, args = event
        return name, (args[0] if args else None)

    async def closed(self, timeout: float = WAIT) -> int:
        if self.refused is not None:
            return int(self.refused["code"])
        await self.p2.wait_disconnected(timeout)
        assert self.p2.alerts, f"disconnected without an alert: {self.p2.names}"
        info = info_of(self.p2.alerts[-1])
        assert info["fatal"] is True, info
        return int(info["code"])

    async def flood(self) -> None:
        try:
            for n in range(300):
                await self.p2.client.emit("contract-flood", n)
        except socketio.exceptions.SocketIOError:
            pass  # disconnected meanwhile

    async def close(self) -> None:
        await self.p2.close()


class TestSocketIOContract(ProtocolContract, RecoveryContract, IncomingContract):
    protocol = "socketio"

    async def connect(self, url: str, token: str | None, *, version: str = "v1") -> ContractClient:
        client = SocketIOClient(url)
        await client.open(token, version, {})
        return client

    async def resume(self, url: str, token: str, since: str) -> ContractClient:
        client = SocketIOClient(url)
        ack = await client.open(token, "v1", {"since": since})
        assert ack is not None and ack["recovered"] is True, ack
        return client


# -- Server-Sent Events ---------------------------------------------------------------------------


class SseClient:
    """One stream: codes from a refusal's JSON body, or the last ``alert`` event before its end."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.stream = Stream(response)

    async def receive(self, timeout: float = WAIT) -> tuple[str, Any]:
        while (event := await self.stream.next(timeout)).get("event", "").startswith("__"):
            pass
        assert event, "the stream ended"
        return event["event"], json.loads(event["data"])

    async def closed(self, timeout: float = WAIT) -> int:
        if self.response.status != 200:
            return int((await self.response.json())["code"])
        code = None
        while event := await self.stream.next(timeout):
            if event.get("event") == "alert":
                code = json.loads(event["data"])["code"]
        assert code is not None, "the stream ended without an alert"
        return int(code)

    async def close(self) -> None:
        self.response.close()


class TestSseContract(ProtocolContract, RecoveryContract):
    protocol = "sse"

    async def connect(self, url: str, token: str | None, *, version: str = "v1") -> ContractClient:
        return await self._open(url, token, {"v": version})

    async def resume(self, url: str, token: str, since: str) -> ContractClient:
        return await self._open(url, token, {"v": "v1"}, {"Last-Event-ID": since})

    async def _open(
        self,
        url: str,
        token: str | None,
        params: dict[str, str],
        headers: dict[str, str] | None = None,
    ) -> SseClient:
        """``GET /events``; a stream is held once the gateway counts one more listener (its
        ``200`` comes before the index)."""
        before = self.gateway.listeners()
        headers = dict(headers or {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        response = await self.http.get(url + "/events", params=params, headers=headers)
        if response.status == 200:
            await self.held(before)
        return SseClient(response)


# -- Flywheel -------------------------------------------------------------------------------------


class FlywheelContractClient:
    """A bound Flywheel connection: codes from its close frame."""

    def __init__(self, client: FlywheelClient, code: int | None = None) -> None:
        self.client = client
        self.code = code  # closed before its BindResponse (an unknown version)

    async def receive(self, timeout: float = WAIT) -> tuple[str, Any]:
        while (message := await self.client.receive(timeout))[0].startswith("$remote/"):
            pass  # the gateway's alerts and errors
        topic, body = message
        return topic, (json.loads(body) if body else None)

    async def closed(self, timeout: float = WAIT) -> int:
        if self.code is not None:
            return self.code
        return await close_code(self.client.websocket, timeout)

    async def flood(self) -> None:
        await flood_websocket(self.client.websocket, 'B {"subscribe": ["contract/#"]}')

    async def close(self) -> None:
        await self.client.close()


class TestFlywheelContract(ProtocolContract, IncomingContract):
    protocol = "flywheel"

    async def connect(self, url: str, token: str | None, *, version: str = "v1") -> ContractClient:
        client = await FlywheelClient.open(self.http, url, path=f"/broker?v={version}")
        bind: dict[str, Any] = {"subscribe": ["contract/#"]}
        if token is not None:
            bind["auth"] = {"type": "Bearer", "token": token}
        try:
            await client.send_bind(**bind)
        except (ConnectionError, aiohttp.ClientError):
            pass  # closed at once: read below
        message = await client.websocket.receive(timeout=WAIT)
        if message.type is not aiohttp.WSMsgType.TEXT:
            return FlywheelContractClient(client, client.websocket.close_code)
        # a BindResponse; with errors, the close follows (read by closed())
        assert str(message.data).startswith("B "), message
        return FlywheelContractClient(client)


# -- Gobbler --------------------------------------------------------------------------------------


class GobblerContractClient:
    """A Gobbler connection subscribed to ``contract``: codes from its close frame."""

    def __init__(self, client: GobblerClient, code: int | None = None) -> None:
        self.client = client
        self.code = code  # closed before #ok-connected

    async def receive(self, timeout: float = WAIT) -> tuple[str, Any]:
        while not isinstance(frame := await self.client.next(timeout), GobblerMessage):
            pass  # status messages (!refresh-required...)
        return frame.path, json.loads(frame.body)

    async def closed(self, timeout: float = WAIT) -> int:
        if self.code is not None:
            return self.code
        return await close_code(self.client.websocket, timeout)

    async def flood(self) -> None:
        await flood_websocket(self.client.websocket, "- contract/none")

    async def close(self) -> None:
        await self.client.close()


class TestGobblerContract(ProtocolContract, IncomingContract):
    protocol = "gobbler"

    async def connect(self, url: str, token: str | None, *, version: str = "v1") -> ContractClient:
        client = await GobblerClient.open(self.http, url, token, query=f"?v={version}")
        message = await client.websocket.receive(timeout=WAIT)
        if message.type is not aiohttp.WSMsgType.TEXT:
            return GobblerContractClient(client, client.websocket.close_code)
        hello = parse(str(message.data))
        assert getattr(hello, "kind", None) == "#ok-connected", hello
        await client.send("+ contract")
        await client.status("#subscribed-to")
        return GobblerContractClient(client)
