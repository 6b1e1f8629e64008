"""The Server-Sent Events outbound (``clients.md`` section 13): ``GET {outbound.sse_path}``.

A stream is a :class:`~bow_gateway.outbound.connection.Connection` of the :class:`SseCodec`,
authenticated once (no re-authentication), held in the index like a protocol-2 socket (criteria,
topic filters, the per-id limits of sockets and of bytes waiting, the anonymous limit, kicks,
counts), and written to by delivery like any other: each message is encoded once per codec, chunk
framing included, and the same bytes go straight to every stream's transport. Refusals before the
stream are JSON ``{"code", "reason", "reconnect"}``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import deque
from typing import TYPE_CHECKING, Any, Final, Unpack

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11

from ...core import codes
from ...core.codes import Code
from ...core.criteria import ListenerId
from ...core.message import MessageEvent, dumps
from ...core.topics import parse_filter
from ...runtime.config import Config
from ...runtime.http_server import HandshakeLimits
from ..codec import GAP_EVENT, AlertOptions, Encoded
from ..connection import Connection, logger
from ..endpoints import Origins, bearer_token, let_go, pick_version, refusal, take_in
from ..expiry import Refusal
from ..recovery import ack_result
from ..registry import ClientProtocol, Handler, register
from ..subscriptions import ANONYMOUS
from ..subscriptions import refusal as filters_refusal

if TYPE_CHECKING:
    from ..hub import Hub

HEARTBEAT: Final = 15.0  # seconds between two comment lines on every stream
SWEEP: Final = 1.0  # seconds between two looks for streams whose client went
HEARTBEAT_PACKET: Final = b":\n\n"


class SseCodec:
    """``text/event-stream`` events; ``chunked``: each framed as one HTTP/1.1 chunk, since the
    bytes go to the transport around aiohttp's writer (framed once per message, not per stream)."""

    __slots__ = (
        "acknowledges",
        "chunked",
        "coded",
        "name",
        "positioned",
        "protocol",
        "reauthenticates",
    )

    def __init__(self, *, chunked: bool) -> None:
        self.chunked = chunked
        self.acknowledges = False
        self.protocol = "sse"
        self.name = "sse-chunked" if chunked else "sse"
        self.positioned = self.coded = True
        self.reauthenticates = False

    def message(self, event: MessageEvent, position: str, ack_id: int = 0) -> Encoded:
        packet = self.replayed(event, position)
        return packet, self.frame(packet)

    def replayed(self, event: MessageEvent, position: str) -> bytes:
        message = event.message
        return b"id: %s\nevent: %s\ndata: %s\n\n" % (
            position.encode(),
            _field(message.name),
            dumps(message.payload),
        )

    def frame(self, packet: bytes) -> bytes:
        if not self.chunked:
            return packet
        return b"%x\r\n%s\r\n" % (len(packet), packet)

    def alert(self, code: Code, text: str, **options: Unpack[AlertOptions]) -> bytes:
        data = {"code": code.code, "reason": code.reason, "text": text}
        return b"event: alert\ndata: " + dumps(data) + b"\n\n"

    def gateway_event(self, name: str, meta: dict[str, Any]) -> bytes:
        """``__gap``: an event whose id moves the client on; ``__position``: the id alone (an
        event without data is not dispatched, but it sets ``lastEventId``)."""
        position = str(meta.get("position") or "").encode()
        head = b"id: %s\n" % position if position else b""
        if name != GAP_EVENT:
            return head + b"\n" if head else HEARTBEAT_PACKET
        return head + b"event: %s\ndata: %s\n\n" % (name.encode(), dumps(meta))


SSE_CHUNKED: Final = SseCodec(chunked=True)
SSE_PLAIN: Final = SseCodec(chunked=False)


def _field(name: str) -> bytes:
    """A name on one line: a CR or LF in it would end the field (JSON-escaped then)."""
    if "\n" in name or "\r" in name:
        return json.dumps(name, ensure_ascii=False)[1:-1].encode()
    return name.encode()


class SseEndpoint:
    """The handler of ``GET {outbound.sse_path}`` over the core (:class:`~..hub.Hub`)."""

    def __init__(
        self,
        outbound: Hub,
        limits: HandshakeLimits,
        *,
        cors_origins: list[str] | None = None,
    ) -> None:
        self._outbound = outbound
        self._limits = limits
        self._origins = Origins(cors_origins)
        self._streams: set[Connection] = set()
        self._sweeping = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        outbound = self._outbound
        cors = self._origins.cors_headers(request)
        why = await self._limits.admit()
        if why is not None:
            return _refusal(codes.TOO_MANY_REQUESTS, 503, why, cors, {hdrs.RETRY_AFTER: "1"})
        plugin, why = pick_version(outbound, request)
        if plugin is None:
            return _refusal(codes.UNKNOWN_VERSION, 404, why, cors)
        filters = request.query.getall("topic", [])
        try:
            for text in filters:
                parse_filter(text)
        except ValueError as error:
            return _refusal(codes.BAD_REQUEST, 400, f"topic: {error}", cors)
        if len(set(filters)) > outbound.settings.max_filters:
            text = f"at most {outbound.settings.max_filters} topic filters (outbound.max_filters)"
            return _refusal(codes.BAD_REQUEST, 400, text, cors)
        token = bearer_token(request)
        if token is None and plugin.anonymous_criteria is None:
            text = "no token: send Authorization: Bearer or the token query parameter"
            return _refusal(codes.AUTH_REFUSED, 401, text, cors)
        since = request.headers.get("Last-Event-ID") or request.query.get("lastEventId")
        sid = "sse-" + secrets.token_urlsafe(12)
        chunked = request.version == HttpVersion11
        connection = Connection(sid, sid, plugin, codec=SSE_CHUNKED if chunked else SSE_PLAIN)
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        connection.ended = ended
        connection.backlog = deque()  # what is delivered before the stream starts waits
        take_in(outbound, connection)
        try:
            return await self._serve(request, connection, ended, token, filters, since, cors)
        finally:
            self._forget(connection)

    async def _serve(
        self,
        request: web.Request,
        connection: Connection,
        ended: asyncio.Future[None],
        token: str | None,
        filters: list[str],
        since: str | None,
        cors: dict[str, str],
    ) -> web.StreamResponse:
        outbound = self._outbound
        admission = outbound.admission
        response: web.StreamResponse | None = None

        async def start(listener_id: ListenerId | None) -> None:
            """Its filters checked, the stream started, the filters held: before the index."""
            nonlocal response
            who = ANONYMOUS if listener_id is None else listener_id
            too_many = filters_refusal(outbound, connection, set(filters), who=who)
            if too_many is not None:
                raise Refusal(f"topic: {too_many}", codes.BAD_REQUEST, kind=None)
            if connection.closing is not None:
                raise Refusal("this instance is stopping", codes.SHUTDOWN, kind=None)
            response = await self._start(request, connection, cors)
            if connection.transport is None:
                return  # the client went: held for a moment, let go when _serve returns
            topics = outbound.topics[connection.outbound.middleware_version]
            for text in filters:
                topics.add(connection, text, owner=who)

        try:
            admitted = await admission.admit(connection, token, prepare=start)
        except Refusal as refusal:
            if response is None:
                return _refused(refusal, cors)
            admission.refuse(connection, refusal)  # a kick while the functions ran
            await ended
            return response
        if admitted is None or response is None or connection.transport is None:
            return response or _refusal(codes.SHUTDOWN, 503, "this instance is stopping", cors)
        options = {} if since is None else {"since": since}
        listener_id, criteria = admitted.listener_id, admitted.criteria
        result = await ack_result(outbound, connection, listener_id, criteria, options) or {}
        replay: list[bytes] = result.pop("_replay", None) or []
        pending = connection.backlog or deque()
        if result.get("recovered") is False:
            gap = {"position": result["position"], "reason": result["reason"]}
            replay.insert(0, connection.codec.gateway_event(GAP_EVENT, gap))
        outbound.writer.begin_replay(connection, replay)
        if pending:
            assert connection.backlog is not None
            connection.backlog.extend(pending)
            connection.backlog_bytes = sum(len(packet) for packet in pending)
        self._streams.add(connection)
        if not self._sweeping:
            self._sweeping = True
            outbound.spawn(self._sweep())  # cancelled by close_all, with the sockets' jobs
        await admission.share(connection, admitted)
        await outbound.writer.replay(connection)
        if connection.transport.is_closing():
            return response
        await ended
        return response

    async def _start(
        self, request: web.Request, connection: Connection, cors: dict[str, str]
    ) -> web.StreamResponse:
        """The stream's ``200``, its headers sent; from here to the replay, what is delivered
        waits in the backlog (the recovery's scan takes turns with the event loop)."""
        response = web.StreamResponse(
            headers={
                hdrs.CONTENT_TYPE: "text/event-stream",
                hdrs.CACHE_CONTROL: "no-cache",
                "X-Accel-Buffering": "no",
                **cors,
            }
        )
        if connection.codec is SSE_CHUNKED:
            response.enable_chunked_encoding()
        await response.prepare(request)
        connection.transport = request.transport
        if connection.transport is not None:
            self._outbound.writer.bound_kernel_buffer(connection.transport)
        return response

    def _forget(self, connection: Connection) -> None:
        """The stream ended (the gateway closed it, or its client went): as a disconnect."""
        self._streams.discard(connection)
        let_go(self._outbound, connection)

    async def _sweep(self) -> None:
        """Forever, while streams are open: end those whose client went (each second), and
        write a comment line to every stream each :data:`HEARTBEAT` seconds."""
        try:
            await self._sweeping_loop()
        finally:
            self._sweeping = False

    async def _sweeping_loop(self) -> None:
        loop = asyncio.get_running_loop()
        beat = loop.time() + HEARTBEAT
        while self._streams:
            await asyncio.sleep(SWEEP)
            heartbeat = loop.time() >= beat
            if heartbeat:
                beat = loop.time() + HEARTBEAT
            for connection in list(self._streams):
                transport = connection.transport
                if transport is None or transport.is_closing():
                    if connection.closing is None:
                        connection.closing = "client gone"
                    if connection.ended is not None and not connection.ended.done():
                        connection.ended.set_result(None)
                elif heartbeat:
                    self._outbound.writer.write(connection, HEARTBEAT_PACKET)


def _refused(refusal: Refusal, cors: dict[str, str]) -> web.Response:
    """A refusal of admission before the stream: ``401`` for credentials refused, ``503`` with
    ``Retry-After`` at a limit or while the instance stops, ``400`` for the rest."""
    if refusal.code in (codes.AUTH_REFUSED, codes.TOKEN_EXPIRED):
        return _refusal(refusal.code, 401, str(refusal), cors)
    if refusal.code in (codes.TOO_MANY_SOCKETS, codes.SHUTDOWN):
        return _refusal(refusal.code, 503, str(refusal), cors, {hdrs.RETRY_AFTER: "1"})
    return _refusal(refusal.code, 400, str(refusal), cors)


def _refusal(
    code: Code,
    status: int,
    text: str,
    cors: dict[str, str],
    headers: dict[str, str] | None = None,
) -> web.Response:
    """A refusal before the stream: ``{"code", "reason", "reconnect"}`` (and why, as text)."""
    logger.info("refusing an SSE stream: %s", text)
    return refusal(code, status, text, {**cors, **(headers or {})})


def _serving(hub: Hub, limits: HandshakeLimits, config: Config) -> Handler:
    return SseEndpoint(hub, limits, cors_origins=config.cors_origins).handle


register(
    ClientProtocol(
        name="sse",
        title="Server-Sent Events GET",
        default_path="/events",
        endpoint=_serving,
        liveness=f"a comment line every {HEARTBEAT:g} s; a stream whose client went is ended",
        websocket=False,
        how=" with Authorization: Bearer <token>",
    )
)
