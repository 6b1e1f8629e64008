"""What the endpoints of the protocols aiohttp serves directly (SSE, Flywheel, Gobbler) share:
the version a client asks for, its token, the origins allowed (``outbound.cors_origins``), taking a
connection into the outbound's core and out of it, what a plain WebSocket's client may send (the
rule Socket.IO's clients follow, control frames included), and closing a plain WebSocket with a
code of section 10."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Final, NamedTuple

from aiohttp import WSMessage, WSMsgType, hdrs, web

from ..core import codes
from ..core.codes import Code
from ..core.plugins import OutboundPlugin
from ..runtime.http_server import HandshakeLimits
from ..runtime.ratelimit import TokenBucket
from ..seams.guard import INCOMING_BURST, INCOMING_RATE
from .connection import Connection, logger

if TYPE_CHECKING:
    from .sockets import SocketOutbound

MAX_CLOSE_REASON: Final = 123  # bytes of a close frame's reason (RFC 6455 5.5)
CLOSE_WAIT: Final = 1.0  # seconds a closed connection's client has to answer the close


def pick_version(
    outbound: SocketOutbound, request: web.Request
) -> tuple[OutboundPlugin | None, str]:
    """The outbound the query's ``v`` names (optional when only one is served), or None and
    why not."""
    plugins = outbound.outbounds
    asked = request.query.get("v")
    if asked is None and len(plugins) == 1:
        return next(iter(plugins.values())), ""
    if not asked:
        return None, "no outbound version: ask with ?v="
    found = plugins.get(asked.removeprefix("v"))
    if found is None:
        known = ", ".join(sorted(p.version for p in plugins.values())) or "none"
        return None, f"unknown outbound version {asked[:64]!r}: this gateway serves {known}"
    return found, ""


def bearer_token(request: web.Request) -> str | None:
    """The bearer token of the ``Authorization`` header, else the ``token`` query parameter
    (for ``EventSource`` and browsers' ``WebSocket``, which cannot set headers)."""
    header = request.headers.get(hdrs.AUTHORIZATION, "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.query.get("token") or None


class Origins:
    """``outbound.cors_origins``, by the rule python-engineio applies to Socket.IO: a request
    without ``Origin`` is not a browser's and passes; ``[]`` admits only the gateway's own origin
    (as the request reached it, or as a proxy's ``X-Forwarded-Proto``/``-Host`` say), a list
    only its origins, ``["*"]`` any."""

    def __init__(self, allowed: list[str] | None) -> None:
        self._allowed = frozenset(allowed or [])

    def foreign(self, request: web.Request) -> str | None:
        """The request's ``Origin`` if it is not allowed, else None."""
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is None or "*" in self._allowed or origin in self._allowed:
            return None
        if not self._allowed and origin.lower() in _own_origins(request):
            return None
        return origin

    def cors_headers(self, request: web.Request) -> dict[str, str]:
        """``Access-Control-Allow-Origin`` for an origin the list allows (SSE's answer)."""
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is None or not self._allowed or self.foreign(request) is not None:
            return {}
        if "*" in self._allowed:
            return {hdrs.ACCESS_CONTROL_ALLOW_ORIGIN: "*"}
        return {hdrs.ACCESS_CONTROL_ALLOW_ORIGIN: origin, hdrs.VARY: "Origin"}

    def refuse(self, request: web.Request, protocol: str) -> web.Response | None:
        """``403`` for a WebSocket handshake from a page of an origin not allowed (browsers
        apply no CORS to WebSockets: the gateway must refuse), else None."""
        origin = self.foreign(request)
        if origin is None:
            return None
        text = f"origin {origin[:256]} is not allowed (outbound.cors_origins)"
        logger.info("refusing a %s connection: %s", protocol, text)
        return refusal(codes.BAD_REQUEST, 403, text)


def _own_origins(request: web.Request) -> set[str]:
    """The gateway's origin as the request reached it, and as a proxy forwarded it."""
    own = {f"{request.scheme}://{request.host}".lower()}
    proto = request.headers.get("X-Forwarded-Proto")
    host = request.headers.get("X-Forwarded-Host")
    if proto or host:
        scheme = (proto or request.scheme).split(",")[0].strip()
        own.add(f"{scheme}://{(host or request.host).split(',')[0].strip()}".lower())
    return own


def refusal(
    code: Code, status: int, text: str, headers: dict[str, str] | None = None
) -> web.Response:
    """A refusal before a stream or an upgrade: ``{"code", "reason", "reconnect", "text"}``."""
    return web.json_response({**code.data(), "text": text}, status=status, headers=headers)


def too_busy(text: str, headers: dict[str, str] | None = None) -> web.Response:
    """``503`` with ``Retry-After`` at a handshake limit."""
    return refusal(codes.TOO_MANY_REQUESTS, 503, text, {**(headers or {}), hdrs.RETRY_AFTER: "1"})


def take_in(outbound: SocketOutbound, connection: Connection) -> None:
    """Count a new connection as open, and let its outbound's topic index hold it."""
    outbound.connections[connection.sid] = connection
    outbound.open_connections += 1
    outbound.metrics.connections_open.inc()
    outbound.metrics.sockets_connected.labels(
        connection.outbound.version, connection.codec.protocol
    ).inc()


def let_go(outbound: SocketOutbound, connection: Connection) -> bool:
    """The connection ended (the gateway closed it, or its client went): as a disconnect, once;
    False if it was let go already."""
    if outbound.connections.pop(connection.sid, None) is None:
        return False
    outbound.open_connections -= 1
    outbound.metrics.connections_open.dec()
    outbound.metrics.sockets_connected.labels(
        connection.outbound.version, connection.codec.protocol
    ).dec()
    outbound.admission.forget(connection)
    outbound.topics[connection.outbound.middleware_version].discard(connection)
    why = connection.closing or "client gone"
    connection.closing = why
    connection.backlog = None
    outbound.metrics.disconnects.labels(why).inc()
    logger.info("%s connection %s ended: %s", connection.codec.protocol, connection.sid, why)
    if connection.ended is not None and not connection.ended.done():
        connection.ended.set_result(None)
    return True


def plain_websocket(
    max_incoming_bytes: int, close_wait: float, heartbeat: float | None = None
) -> web.WebSocketResponse:
    """A plain WebSocket's response (Flywheel, Gobbler), read with :class:`IncomingFrames`:
    ``autoping=False``, so that a client's pings come to it and are counted (aiohttp's own
    answer would cost a write a ping, unbounded). ``heartbeat`` still works without autoping:
    aiohttp resets it on any bytes the client sends, its pong included."""
    return web.WebSocketResponse(
        autoping=False,
        heartbeat=heartbeat,
        compress=False,
        max_msg_size=max_incoming_bytes,
        timeout=close_wait,
    )


class IncomingFrames:
    """What a plain-WebSocket client (Flywheel, Gobbler) sends, held to the rule and the numbers
    of Socket.IO's (:data:`~..seams.guard.INCOMING_BURST` frames at once, then
    :data:`~..seams.guard.INCOMING_RATE` a second; past it, 4011): data frames and control
    frames alike. A ping costs the gateway a pong, a pong a look at the connection's pings: a
    client flooding either is closed as one flooding text frames. Its websocket must be a
    :func:`plain_websocket` (pings are answered here, not by aiohttp)."""

    __slots__ = ("_bucket", "_connection", "_outbound", "_ponged", "_websocket")

    def __init__(
        self,
        outbound: SocketOutbound,
        websocket: web.WebSocketResponse,
        connection: Connection,
        ponged: Callable[[], None] | None = None,
    ) -> None:
        self._outbound = outbound
        self._websocket = websocket
        self._connection = connection
        self._ponged = ponged  # what a pong within the rule tells (Flywheel's own pings)
        self._bucket = TokenBucket(INCOMING_RATE, INCOMING_BURST)

    async def next(self) -> WSMessage | None:
        """The client's next text or binary frame within the rule, pings answered and pongs
        told on the way; None once the connection ended (a close, a frame over the size, the
        client gone: what it sent and was not handled yet is dropped). While the gateway closes
        the connection, nothing it sends counts, nor is answered."""
        connection = self._connection
        while True:
            received = await self._websocket.receive()
            kind = received.type
            if kind not in _FRAMES:
                return None  # CLOSE, CLOSING, CLOSED, ERROR (a frame over max_incoming_bytes...)
            if gone(connection):
                return None
            if connection.closing is not None:
                continue
            if not self._bucket.take():
                flooded(self._outbound, connection)
            elif kind is WSMsgType.PING:
                try:
                    await self._websocket.pong(received.data)
                except ConnectionError:
                    return None  # gone while its pong waited for the socket to drain
            elif kind is WSMsgType.PONG:
                if self._ponged is not None:
                    self._ponged()
            else:
                return received


_FRAMES: Final = frozenset({WSMsgType.TEXT, WSMsgType.BINARY, WSMsgType.PING, WSMsgType.PONG})


def flooded(outbound: SocketOutbound, connection: Connection) -> None:
    """Close a connection whose client sent frames past :class:`IncomingFrames`' rule: 4011."""
    text = f"over {INCOMING_RATE:g} frames a second ({INCOMING_BURST:g} at once)"
    outbound.close(connection, codes.TOO_MANY_REQUESTS, text)


def gone(connection: Connection) -> bool:
    """Whether the client of a plain WebSocket or SSE stream went (its transport is closing):
    what it sent and was not handled yet is dropped, never handled."""
    transport = connection.transport
    return transport is None or transport.is_closing()


async def close_websocket(websocket: web.WebSocketResponse, connection: Connection) -> None:
    """Close a WebSocket the gateway ended, with its code and why (1000 when it has none)."""
    code, text = connection.farewell or (1000, "")
    await websocket.close(code=code, message=close_reason(text))


def close_reason(text: str) -> bytes:
    """A close frame's reason: at most 123 bytes of UTF-8, cut on a character boundary."""
    return text.encode()[:MAX_CLOSE_REASON].decode(errors="ignore").encode()


def not_an_upgrade(protocol: str) -> web.Response:
    text = f"the {protocol} outbound takes a WebSocket upgrade (GET with Upgrade: websocket)"
    return refusal(codes.BAD_REQUEST, 400, text)


class Upgraded(NamedTuple):
    """A plain WebSocket opened, and the outbound its client asked for."""

    websocket: web.WebSocketResponse
    plugin: OutboundPlugin


class PlainWebSocketEndpoint(abc.ABC):
    """What the plain-WebSocket endpoints (Flywheel, Gobbler) share: their settings, and the
    upgrade: the origin, the handshake limits, the version asked for."""

    protocol: ClassVar[str]  # as logs and refusals name it

    def __init__(
        self,
        outbound: SocketOutbound,
        limits: HandshakeLimits,
        *,
        max_incoming_bytes: int = 16_384,
        max_publishes_per_second: int = 100,
        cors_origins: list[str] | None = None,
    ) -> None:
        self._outbound = outbound
        self._limits = limits
        self._origins = Origins(cors_origins)
        self._max_incoming_bytes = max_incoming_bytes
        self._max_publishes = max_publishes_per_second
        self._init_protocol()

    @abc.abstractmethod
    def _init_protocol(self) -> None:
        """What a protocol's endpoint keeps besides: set here, once the settings are."""

    def _heartbeat(self) -> float | None:
        """aiohttp's heartbeat: seconds without a byte from the client before it pings it."""
        return None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """``GET`` on the endpoint's path: a connection, for as long as it lasts."""
        upgraded = await self._upgrade(request)
        if not isinstance(upgraded, Upgraded):
            return upgraded
        await self._serve(request, upgraded.websocket, upgraded.plugin)
        return upgraded.websocket

    @abc.abstractmethod
    async def _serve(
        self, request: web.Request, websocket: web.WebSocketResponse, plugin: OutboundPlugin
    ) -> None:
        """The protocol, over the WebSocket opened, until the connection ends."""

    async def _upgrade(self, request: web.Request) -> web.StreamResponse | Upgraded:
        """The WebSocket opened, with the outbound its client asked for; or the answer that
        refuses it (a WebSocket closed with 4xxx once the version is unknown)."""
        refused = self._origins.refuse(request, self.protocol)
        if refused is not None:
            return refused
        why = await self._limits.admit()
        if why is not None:
            return too_busy(why)
        websocket = plain_websocket(
            self._max_incoming_bytes, CLOSE_WAIT, heartbeat=self._heartbeat()
        )
        if not websocket.can_prepare(request).ok:
            return not_an_upgrade(self.protocol)
        await websocket.prepare(request)
        plugin, refusal = pick_version(self._outbound, request)
        if plugin is None:
            logger.info("refusing a %s connection: %s", self.protocol, refusal)
            await websocket.close(code=codes.UNKNOWN_VERSION.code, message=close_reason(refusal))
            return websocket
        return Upgraded(websocket, plugin)
