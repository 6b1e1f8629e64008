"""What the endpoints of the protocols aiohttp serves directly (SSE, Flywheel, Gobbler) share:
the version a client asks for, its token, the origins allowed (``outbound.cors_origins``), taking a
connection into the outbound's core and out of it, what a plain WebSocket's client may send (the
rule Socket.IO's clients follow, control frames included), and closing a plain WebSocket with a
code of section 10."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiohttp import hdrs, web

from ..core import codes
from ..core.codes import Code
from ..core.plugins import OutboundPlugin
from .connection import Connection, logger

if TYPE_CHECKING:
    from .hub import Hub

MAX_CLOSE_REASON: Final = 123  # bytes of a close frame's reason (RFC 6455 5.5)
CLOSE_WAIT: Final = 1.0  # seconds a closed connection's client has to answer the close


def pick_version(outbound: Hub, request: web.Request) -> tuple[OutboundPlugin | None, str]:
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


def take_in(outbound: Hub, connection: Connection) -> None:
    """Count a new connection as open, and let its outbound's topic index hold it."""
    outbound.connections[connection.sid] = connection
    outbound.open_connections += 1
    outbound.metrics.connections_open.inc()
    outbound.metrics.sockets_connected.labels(
        connection.outbound.version, connection.codec.protocol
    ).inc()


def let_go(outbound: Hub, connection: Connection) -> bool:
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


def gone(connection: Connection) -> bool:
    """Whether the client of a plain WebSocket or SSE stream went (its transport is closing):
    what it sent and was not handled yet is dropped, never handled."""
    transport = connection.transport
    return transport is None or transport.is_closing()
