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

import secrets
import time
from typing import Final

from aiohttp import web

from ...core.codes import Code
from ...core.message import MessageEvent, dumps
from ...wire.frames import websocket_frame
from ..codec import FramedCodec, text_body
from ..connection import Connection
from ..endpoints import bearer_token
from ..plain_websocket import PlainWebSocketEndpoint
from ..registry import ClientProtocol, register
from .gobbler_commands import Commands, status


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
    """The handler of ``GET {outbound.gobbler_path}``: a connection is admitted with the
    handshake's token, then sends commands, run one at a time, in order."""

    protocol = "Gobbler"
    codec = GOBBLER

    def _init_protocol(self) -> None:
        self._commands = Commands(self._outbound, self._max_publishes)

    async def _start(self, request: web.Request, connection: Connection) -> None:
        """The handshake's token, then ``#ok-connected``; a refusal closes with its code."""
        application = request.query.get("applicationId") or secrets.token_urlsafe(12)
        connection.session = application[:64]  # Gobbler's publisherApplicationId
        if not await self._admit(connection, bearer_token(request)):
            return
        user = "" if connection.listener_id is None else str(connection.listener_id)
        hello = {"ApplicationId": connection.session, "UserId": user, "Time": str(int(time.time()))}
        self._outbound.writer.write(
            connection, status("#ok-connected", "You are connected to the server.", hello)
        )

    async def _text(self, connection: Connection, text: str) -> None:
        await self._commands.run(connection, text)


register(
    ClientProtocol(
        name="gobbler",
        title="Gobbler WebSocket",
        default_path="/gobbler",
        endpoint=GobblerEndpoint.serving,
        liveness="WebSocket pings (outbound.liveness)",
        how="&token=<token>, then send '+ /topic' lines",
    )
)
