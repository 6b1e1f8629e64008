"""A fifth client protocol, added from the tests in this one module: proof that a protocol is one
module (issue 28). *Line* is the least a protocol can be: a plain WebSocket, the token in the
handshake, each message one text frame ``{name} {payload JSON}``; the client may send ``ping``
(answered ``pong``), nothing else. It touches no other file: the registry serves it on
``outbound.line_path``, the core admits, delivers, limits and closes it, and it passes the
protocol contract suite (:mod:`tests.support.protocol_contract`) as the bundled protocols do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Final

import aiohttp
import pytest
from aiohttp import web

from bow_gateway.core import codes
from bow_gateway.core.codes import Code
from bow_gateway.core.message import MessageEvent, dumps
from bow_gateway.outbound.codec import FramedCodec
from bow_gateway.outbound.connection import Connection
from bow_gateway.outbound.endpoints import bearer_token
from bow_gateway.outbound.plain_websocket import PlainWebSocketEndpoint
from bow_gateway.outbound.registry import ClientProtocol, register, unregister
from bow_gateway.wire.frames import websocket_frame

from .support import WAIT, base_config, token
from .support.mixed_clients import mixed_bow
from .support.protocol_contract import (
    LISTENER,
    OWN,
    ContractClient,
    IncomingContract,
    ProtocolContract,
    close_code,
    flood_websocket,
)

PATH: Final = "/line"


class LineCodec(FramedCodec):
    """``{name} {payload JSON}``, one text frame a message; a notice is ``! {code} {text}``."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("line", reauthenticates=False)

    def replayed(self, event: MessageEvent, position: str) -> bytes:
        message = event.message
        return websocket_frame(message.name.encode() + b" " + dumps(message.payload))

    def notice(self, code: Code, text: str, session: str | None) -> bytes:
        return websocket_frame(f"! {code.code} {text}".encode())


class LineEndpoint(PlainWebSocketEndpoint):
    """Admitted with the handshake's token, then ``ok``; receives everything its criteria
    match (not strictly subscribed)."""

    protocol = "Line"
    codec = LineCodec()
    strict = False

    async def _start(self, request: web.Request, connection: Connection) -> None:
        if await self._admit(connection, bearer_token(request)):
            self._outbound.writer.write(connection, websocket_frame(b"ok"))

    async def _text(self, connection: Connection, text: str) -> None:
        if text == "ping":
            self._outbound.writer.write(connection, websocket_frame(b"pong"))
        else:
            self._outbound.close(connection, codes.BAD_REQUEST, "send ping, or nothing")


LINE: Final = ClientProtocol(
    name="line",
    title="Line WebSocket",
    default_path=None,  # served where outbound.line_path says
    endpoint=LineEndpoint.serving,
    liveness="WebSocket pings (outbound.liveness)",
    how="&token=<token>",
)


@pytest.fixture(autouse=True, scope="module")
def line_protocol() -> Iterator[None]:
    """The protocol registered for this module's tests only (no other gateway serves it)."""
    register(LINE)
    yield
    unregister(LINE.name)


class LineClient:
    """A Line connection, as the contract suite sees it."""

    def __init__(self, websocket: aiohttp.ClientWebSocketResponse) -> None:
        self.websocket = websocket

    async def receive(self, timeout: float = WAIT) -> tuple[str, Any]:
        text = await self.websocket.receive_str(timeout=timeout)
        name, _, payload = text.partition(" ")
        return name, json.loads(payload)

    async def closed(self, timeout: float = WAIT) -> int:
        return await close_code(self.websocket, timeout)

    async def flood(self) -> None:
        await flood_websocket(self.websocket, "ping")

    async def close(self) -> None:
        await self.websocket.close()


async def open_line(
    http: aiohttp.ClientSession, url: str, listener_token: str | None, version: str = "v1"
) -> aiohttp.ClientWebSocketResponse:
    query = {"v": version, **({"token": listener_token} if listener_token else {})}
    return await http.ws_connect(url.replace("http", "ws", 1) + PATH, params=query)


class TestLineContract(ProtocolContract, IncomingContract):
    protocol = "line"

    def config(self, **outbound: Any) -> dict[str, Any]:
        return super().config(line_path=PATH, **outbound)

    async def connect(self, url: str, token: str | None, *, version: str = "v1") -> ContractClient:
        websocket = await open_line(self.http, url, token, version)
        if version == "v1" and token is not None:
            message = await websocket.receive(timeout=WAIT)
            # ``ok`` once held; a close (refused) is left for closed() to read
            if message.type is aiohttp.WSMsgType.TEXT:
                assert message.data == "ok", message
        return LineClient(websocket)


async def test_line_is_served_only_where_its_path_is_configured(
    start_bow: Any, http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(mixed_bow(base_config()))
    url = f"http://127.0.0.1:{bow.port}"
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await open_line(http, url, token(LISTENER, OWN))
    assert refused.value.status == 401  # no route: the catch-all wants the inbounds' credentials


async def test_a_ping_is_answered_and_anything_else_closes_with_4000(
    start_bow: Any, http: aiohttp.ClientSession
) -> None:
    config = base_config(outbound={"timeout": 5, "line_path": PATH})
    bow = await start_bow(mixed_bow(config))
    websocket = await open_line(http, f"http://127.0.0.1:{bow.port}", token(LISTENER, OWN))
    assert await websocket.receive_str(timeout=WAIT) == "ok"
    await websocket.send_str("ping")
    assert await websocket.receive_str(timeout=WAIT) == "pong"
    await websocket.send_str("subscribe everything")
    assert await close_code(websocket) == codes.BAD_REQUEST.code
