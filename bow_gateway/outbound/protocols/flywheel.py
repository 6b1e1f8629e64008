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
from typing import TYPE_CHECKING, Final

from aiohttp import web

from ...core import codes
from ...core.codes import Code
from ...core.message import MessageEvent, dumps
from ...wire.frames import websocket_frame
from ..codec import FramedCodec, text_body
from ..connection import Connection, logger
from ..plain_websocket import PlainWebSocketEndpoint
from ..publishing import PublishRefused
from ..registry import ClientProtocol, register
from .flywheel_bind import Binder, error_frame

if TYPE_CHECKING:
    pass


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
    """The handler of ``GET {outbound.flywheel_path}``: a connection binds with a ``B`` frame
    within ``outbound.timeout`` of opening."""

    protocol = "Flywheel"
    codec = FLYWHEEL

    def _init_protocol(self) -> None:
        self._binder = Binder(self._outbound)

    async def _start(self, request: web.Request, connection: Connection) -> None:
        outbound = self._outbound
        timeout = outbound.settings.auth_timeout
        deadline = asyncio.get_running_loop().call_later(timeout, self._expire, connection)
        outbound.deadlines[connection.eio_sid] = deadline

    async def _text(self, connection: Connection, text: str) -> None:
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

    def _ended(self, connection: Connection) -> None:
        deadline = self._outbound.deadlines.pop(connection.eio_sid, None)
        if deadline is not None:
            deadline.cancel()
        self._binder.leave_session(connection)


register(
    ClientProtocol(
        name="flywheel",
        title="Flywheel WebSocket",
        default_path="/broker",
        endpoint=FlywheelEndpoint.serving,
        liveness="WebSocket pings (outbound.liveness)",
        how=", then send a B frame with the token",
    )
)
