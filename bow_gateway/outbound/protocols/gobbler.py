"""The Gobbler WebSocket outbound (``clients.md`` section 14): ``GET {outbound.gobbler_path}``.

Gobbler's text protocol over a plain WebSocket (``seeds/gobbler.md``): ``+ path [start [count]]``
subscribes and/or replays a topic's history, ``- path`` cancels, ``> path [id]`` publishes; the
gateway answers with status messages (``#ok-connected``, ``#send``, ``#fetch-start``, ...) and
writes messages in Gobbler's format. The token comes as for SSE (``Authorization: Bearer`` or the
``token`` query parameter, never logged); a connection is held in the index like any other,
strictly subscribed (a Gobbler connection receives only the paths it subscribed to, subtopics
included). Commands run one at a time, in order (:mod:`.gobbler_commands`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import TYPE_CHECKING, Final

from aiohttp import WSMsgType, web

from ...core import codes
from ...core.codes import Code
from ...core.message import MessageEvent, dumps
from ...core.plugins import OutboundPlugin
from ...runtime.ratelimit import TokenBucket
from ...wire.frames import websocket_frame
from ..codec import FramedCodec, text_body
from ..connection import Connection
from ..endpoints import (
    IncomingFrames,
    PlainWebSocketEndpoint,
    bearer_token,
    close_websocket,
    let_go,
    take_in,
)
from ..expiry import Refusal
from .gobbler_commands import Commands, status

if TYPE_CHECKING:
    pass

HEARTBEAT: Final = 25.0  # seconds without a byte from the client before aiohttp pings it


class GobblerCodec(FramedCodec):
    """Gobbler's message format, one text frame per message::

        {path},{sequenceId},{publisherUserId},{publisherApplicationId},{publisherMessageId},{time}
        {headers JSON}
        {body}

    The sequence is the message's in its topic's history (0 when no ``[[history]]`` keeps it);
    the body is :func:`~bow_gateway.outbound.codec.text_body`. The headers line is always there
    (``{}`` without headers), so that a body starting with ``{`` is never taken for it. A non-fatal
    alert (4100) is the status message ``!refresh-required``."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("gobbler", reauthenticates=False)

    def replayed(self, event: MessageEvent, position: str) -> bytes:
        message = event.message
        publication = message.publication
        headers: dict[str, str] = {}
        ids = ["", "", ""]
        if publication is not None:
            headers = publication.headers
            ids = [
                publication.user_id or "",
                publication.application_id or "",
                publication.message_id or "",
            ]
        head = ",".join([message.name, str(event.sequence or 0), *ids, str(int(event.accepted_at))])
        body = text_body(message)
        return websocket_frame(head.encode() + b"\n" + dumps(headers) + b"\n" + body)

    def notice(self, code: Code, text: str, session: str | None) -> bytes:
        return status("!" + code.reason.replace("_", "-"), text, {"code": code.code})


GOBBLER: Final = GobblerCodec()


class GobblerEndpoint(PlainWebSocketEndpoint):
    """The handler of ``GET {outbound.gobbler_path}`` for a :class:`SocketOutbound`."""

    protocol = "Gobbler"

    def _init_protocol(self) -> None:
        """What this endpoint keeps besides what every plain WebSocket's does."""
        self._commands = Commands(self._outbound, self._max_publishes)

    def _heartbeat(self) -> float | None:
        return HEARTBEAT

    async def _serve(
        self, request: web.Request, websocket: web.WebSocketResponse, plugin: OutboundPlugin
    ) -> None:
        outbound = self._outbound
        sid = "gb-" + secrets.token_urlsafe(12)
        connection = Connection(sid, sid, plugin, proto=2, codec=GOBBLER)
        connection.publishes = TokenBucket(self._max_publishes, self._max_publishes)
        connection.transport = request.transport
        application = request.query.get("applicationId") or secrets.token_urlsafe(12)
        connection.session = application[:64]  # Gobbler's publisherApplicationId
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        connection.ended = ended
        ended.add_done_callback(lambda _: outbound.spawn(close_websocket(websocket, connection)))
        take_in(outbound, connection)
        outbound.topics[plugin.middleware_version].hold_strictly(connection)
        if connection.transport is not None:
            outbound.writer.bound_kernel_buffer(connection.transport)
        try:
            await self._authenticate(connection, bearer_token(request))
            await self._read(websocket, connection)  # refused: until the close is answered
        finally:
            let_go(outbound, connection)

    async def _authenticate(self, connection: Connection, token: str | None) -> None:
        """The handshake's token (none: anonymous, where the outbound allows it), then
        ``#ok-connected``; a refusal closes with its code."""
        outbound = self._outbound
        if token is None and connection.outbound.anonymous_criteria is None:
            text = "no token: send Authorization: Bearer or the token query parameter"
            outbound.close(connection, codes.AUTH_REFUSED, text, kind="refused")
            return
        admission = outbound.admission
        try:
            admitted = await admission.admit(connection, token, keep_details=True)
        except Refusal as refusal:
            admission.refuse(connection, refusal)
            return
        if admitted is None:
            return
        await admission.share(connection, admitted)
        if connection.closing is not None:
            return
        user = "" if connection.listener_id is None else str(connection.listener_id)
        hello = {"ApplicationId": connection.session, "UserId": user, "Time": str(int(time.time()))}
        outbound.writer.write(
            connection, status("#ok-connected", "You are connected to the server.", hello)
        )

    async def _read(self, websocket: web.WebSocketResponse, connection: Connection) -> None:
        """Every command the client sends, one at a time, until the connection closes: at most
        :class:`~bow_gateway.outbound.endpoints.IncomingFrames`' rule, pings and pongs included
        (4011 past it), each in a step of its own, none once the client has gone (commands read and
        not run yet are dropped with it)."""
        incoming = IncomingFrames(self._outbound, websocket, connection)
        while (received := await incoming.next()) is not None:
            if received.type is WSMsgType.TEXT:
                await self._commands.run(connection, received.data)
                await asyncio.sleep(0)
            else:
                self._outbound.close(
                    connection,
                    codes.BAD_REQUEST,
                    "binary frames are not supported: Gobbler's text commands only",
                    kind="malformed",
                )
