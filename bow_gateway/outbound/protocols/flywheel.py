"""The Flywheel WebSocket outbound (``clients.md`` section 12): ``GET {outbound.flywheel_path}``.

Flywheel's text protocol over a plain WebSocket: ``B {json}`` binds (authenticates, subscribes),
``P {topic} {body}`` publishes, ``R {topic} {body}`` receives. A connection is a
:class:`~bow_gateway.outbound.connection.Connection` of the :class:`FlywheelCodec`, held in the
index like any other (criteria, the per-id limit, kicks, counts, expiry), strictly subscribed: it
receives only names its filters match, and ``$remote/{sessionId}/rx/...`` without a filter.
Delivery frames a message once for every Flywheel connection and writes the same bytes to each
transport; what the client sends is read through aiohttp's :class:`~aiohttp.web.WebSocketResponse`,
which also closes the connection with the codes of section 10.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import TYPE_CHECKING, Final

from aiohttp import WSMsgType, web

from ...core import codes
from ...core.codes import Code
from ...core.message import MessageEvent, dumps
from ...core.plugins import OutboundPlugin
from ...runtime.ratelimit import TokenBucket
from ...wire.frames import websocket_frame
from ..codec import FramedCodec, text_body
from ..connection import Connection, logger
from ..endpoints import (
    IncomingFrames,
    PlainWebSocketEndpoint,
    close_websocket,
    let_go,
    take_in,
)
from ..publishing import PublishRefused
from .flywheel_bind import Binder, error_frame

if TYPE_CHECKING:
    pass

PING_EVERY: Final = 25.0  # seconds between two pings to a connection
PONG_WITHIN: Final = 20.0  # seconds a client has to answer a ping before it is cut off
SWEEP: Final = 1.0  # seconds between two looks at the connections' pings
PING_FRAME: Final = b"\x89\x00"


class FlywheelCodec(FramedCodec):
    """``R {name} {body}`` text frames (:func:`~bow_gateway.outbound.codec.text_body`); a non-fatal
    alert (4100) is a direct message on ``$remote/{sessionId or anon}/rx/alerts``."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("flywheel", reauthenticates=True)

    def replayed(self, event: MessageEvent, position: str) -> bytes:
        return receive_frame(event.message.name, text_body(event.message))

    def notice(self, code: Code, text: str, session: str | None) -> bytes:
        data = {"code": code.code, "reason": code.reason, "text": text}
        return receive_frame(f"$remote/{session or 'anon'}/rx/alerts", dumps(data))


FLYWHEEL: Final = FlywheelCodec()


def receive_frame(topic: str, body: bytes) -> bytes:
    return websocket_frame(b"R " + topic.encode() + b" " + body)


class FlywheelEndpoint(PlainWebSocketEndpoint):
    """The handler of ``GET {outbound.flywheel_path}`` for a :class:`SocketOutbound`."""

    protocol = "Flywheel"

    def _init_protocol(self) -> None:
        """What this endpoint keeps besides what every plain WebSocket's does."""
        self._binder = Binder(self._outbound)
        # Each open connection's ping state: [when the next ping is due, when the unanswered
        # one was sent (0: none)]
        self._pings: dict[Connection, list[float]] = {}
        self._sweeping = False

    async def _serve(
        self, request: web.Request, websocket: web.WebSocketResponse, plugin: OutboundPlugin
    ) -> None:
        outbound = self._outbound
        sid = "fw-" + secrets.token_urlsafe(12)
        connection = Connection(
            sid,
            sid,
            plugin,
            proto=2,
            codec=FLYWHEEL,
            authenticates_per_minute=outbound.settings.max_authenticates_per_minute,
        )
        connection.publishes = TokenBucket(self._max_publishes, self._max_publishes)
        connection.transport = request.transport
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        connection.ended = ended
        ended.add_done_callback(lambda _: outbound.spawn(close_websocket(websocket, connection)))
        self._open(connection)
        try:
            await self._read(websocket, connection)
        finally:
            self._forget(connection)

    def _open(self, connection: Connection) -> None:
        outbound = self._outbound
        take_in(outbound, connection)
        outbound.topics[connection.outbound.middleware_version].hold_strictly(connection)
        if connection.transport is not None:
            outbound.writer.bound_kernel_buffer(connection.transport)
        loop = asyncio.get_running_loop()
        timeout = outbound.settings.auth_timeout
        outbound.deadlines[connection.eio_sid] = loop.call_later(timeout, self._expire, connection)
        self._pings[connection] = [loop.time() + PING_EVERY, 0.0]
        if not self._sweeping:
            self._sweeping = True
            outbound.spawn(self._sweep())
        logger.info("Flywheel connection %s opened", connection.sid)

    async def _read(self, websocket: web.WebSocketResponse, connection: Connection) -> None:
        """Every frame the client sends, in order, until the connection closes: at most
        :class:`~bow_gateway.outbound.endpoints.IncomingFrames`' rule, pings and pongs included
        (4011 past it), each handled in a step of its own (a client's frames already read never
        hold the event loop together), none once the client has gone (frames read and not handled
        yet are dropped with it). A pong answers the gateway's last ping."""
        incoming = IncomingFrames(
            self._outbound, websocket, connection, lambda: self._pong(connection)
        )
        while (received := await incoming.next()) is not None:
            if received.type is WSMsgType.TEXT:
                await self._frame(connection, received.data)
                await asyncio.sleep(0)
            else:
                self._outbound.close(
                    connection,
                    codes.BAD_REQUEST,
                    "binary frames are not supported: Flywheel's text frames only",
                    kind="malformed",
                )

    def _pong(self, connection: Connection) -> None:
        """The client answered: its next ping is due in :data:`PING_EVERY` seconds."""
        pings = self._pings.get(connection)
        if pings is not None:
            pings[0] = asyncio.get_running_loop().time() + PING_EVERY
            pings[1] = 0.0

    async def _frame(self, connection: Connection, text: str) -> None:
        kind, space, rest = text[:1], text[1:2], text[2:]
        if space != " " or kind not in ("B", "P"):
            self._outbound.close(
                connection,
                codes.BAD_REQUEST,
                "a frame is 'B {json}' or 'P {topic} {body}'",
                kind="malformed",
            )
        elif kind == "B":
            await self._binder.bind(connection, rest)
        else:
            await self._publish(connection, rest)

    async def _publish(self, connection: Connection, text: str) -> None:
        """``P {topic} {body}``: through the outbound's ``create_message_from_publish``; a
        refusal is told on ``$remote/{sessionId or anon}/rx/errors``."""
        outbound = self._outbound
        topic, _, body = text.partition(" ")
        bucket = connection.publishes
        if bucket is not None and not bucket.take():
            why = (
                f"over {self._max_publishes} publishes a second (outbound.max_publishes_per_second)"
            )
        elif not connection.authenticated:
            why = "bind first: with auth, or anonymously where the outbound allows it"
        elif outbound.client_publish is None:
            why = "this gateway takes no publish from clients"
        else:
            details = connection.details if connection.listener_id is not None else None
            try:
                await outbound.client_publish(connection.outbound, details, topic, body)
            except PublishRefused as error:
                why = str(error)
            else:
                outbound.metrics.client_publishes.labels("flywheel", "accepted").inc()
                return
        outbound.metrics.client_publishes.labels("flywheel", "refused").inc()
        logger.info("Flywheel connection %s: publish refused: %s", connection.sid, why)
        outbound.writer.write(connection, error_frame(connection, why, topic))

    def _expire(self, connection: Connection) -> None:
        """Not bound as a listener within ``outbound.timeout``: 4001."""
        self._outbound.deadlines.pop(connection.eio_sid, None)
        if not connection.authenticated and connection.closing is None:
            timeout = self._outbound.settings.auth_timeout
            self._outbound.metrics.authentications.labels(
                connection.outbound.version, "timeout"
            ).inc()
            self._outbound.close(
                connection,
                codes.AUTH_TIMEOUT,
                f"not bound within {timeout:g} s of connecting",
                kind="timeout",
            )

    def _forget(self, connection: Connection) -> None:
        """The connection ended (the gateway closed it, or its client went): as a disconnect."""
        outbound = self._outbound
        self._pings.pop(connection, None)
        deadline = outbound.deadlines.pop(connection.eio_sid, None)
        if deadline is not None:
            deadline.cancel()
        self._binder.leave_session(connection)
        let_go(outbound, connection)

    async def _sweep(self) -> None:
        """While connections are open: ping each every :data:`PING_EVERY` seconds, and cut off
        one that has not answered within :data:`PONG_WITHIN`."""
        try:
            loop = asyncio.get_running_loop()
            while self._pings:
                await asyncio.sleep(SWEEP)
                self._look(loop.time())
        finally:
            self._sweeping = False

    def _look(self, now: float) -> None:
        """One sweep: a function of its own, so that no connection it looked at stays referenced
        (by a loop variable of :meth:`_sweep`'s frame) while the sweep sleeps."""
        for connection, pings in list(self._pings.items()):
            transport = connection.transport
            if transport is None or transport.is_closing():
                continue
            if pings[1] and now - pings[1] > PONG_WITHIN:
                logger.info("Flywheel connection %s: no pong: cut off", connection.sid)
                connection.closing = connection.closing or "ping timeout"
                transport.abort()
            elif not pings[1] and now >= pings[0]:
                pings[1] = now
                transport.write(PING_FRAME)
