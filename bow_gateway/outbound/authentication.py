"""Socket.IO's ``authenticate``: its arguments, then :class:`~.admission.Admission`, then the ack
(and, on protocol 2, the recovery).

Protocol 1 is Bow's: one ``authenticate``, a second ignored. Protocol 2 (section 8) takes
options (``since``: recovery, section 7), re-authenticates on every later ``authenticate`` (one at
a time), keeps the identity, admits anonymous listeners and enforces ``exp`` with a grace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from ..core import codes
from ..core.history import History
from . import codec
from .admission import Admission
from .connection import Connection
from .expiry import Refusal
from .parts import Sockets
from .recovery import ack_result


class Authenticator:
    """Runs Socket.IO's ``authenticate`` events for :class:`~.sockets.SocketOutbound`, through
    its :class:`~.admission.Admission`."""

    def __init__(self, outbound: Sockets, admission: Admission) -> None:
        self._outbound = outbound
        self._admission = admission

    async def authenticate(self, sid: str, eio_sid: str, args: list[Any], ack_id: Any) -> None:
        outbound = self._outbound
        connection = outbound.connections.get(sid)
        if connection is None or connection.closing is not None:
            return
        if not connection.authenticates.take():
            limit = outbound.settings.max_authenticates_per_minute
            outbound.close(
                connection, codes.TOO_MANY_REQUESTS, f"over {limit} authenticate a minute"
            )
            return
        if not connection.codec.coded:  # protocol 1
            if connection.busy or connection.authenticated:
                return  # busy, or already authenticated: ignored, as Bow does
            connection.busy = True
            try:
                await self._authenticate(connection, args, ack_id)
            finally:
                connection.busy = False
            return
        if connection.lock is None:
            connection.lock = asyncio.Lock()
        async with connection.lock:  # one at a time, in arrival order
            if connection.closing is None:
                await self._authenticate(connection, args, ack_id)

    async def _authenticate(self, connection: Connection, args: list[Any], ack_id: Any) -> None:
        outbound = self._outbound
        history = outbound.history
        try:
            token, options = _arguments(connection, args, ack_id)
        except Refusal as refusal:
            outbound.metrics.authentications.labels(connection.outbound.version, "refused").inc()
            self._admission.refuse(connection, refusal)
            return
        if connection.authenticated:
            options = {}  # since belongs to the first authenticate: the rest was delivered
        since = options.get("since")
        try:
            admitted = await self._admission.admit(
                connection, token, caught_up=lambda: _caught_up(history, since)
            )
        except Refusal as refusal:
            self._admission.refuse(connection, refusal)
            return
        if admitted is None:
            return  # disconnected (or timed out) while the user's functions ran
        result = await ack_result(
            outbound, connection, admitted.listener_id, admitted.criteria, options
        )
        replay = None if result is None else result.pop("_replay", None)
        outbound.writer.write(
            connection, codec.ack(ack_id, result, proto=2 if connection.codec.coded else 1)
        )
        if replay:
            outbound.writer.begin_replay(connection, replay)  # now: what follows waits behind it
        await self._admission.share(connection, admitted)
        if replay:
            await outbound.writer.replay(connection)


def _arguments(
    connection: Connection, args: list[Any], ack_id: Any
) -> tuple[Any, Mapping[str, Any]]:
    """The token and the options of an ``authenticate``, or a :class:`Refusal` (4000)."""
    if ack_id is None:
        raise Refusal("authenticate needs an acknowledgement callback", codes.BAD_REQUEST)
    token = args[0] if args else None
    options: Any = {}
    if connection.codec.coded:  # protocol 2
        if len(args) > 2:
            raise Refusal("authenticate takes (token, options, ack)", codes.BAD_REQUEST)
        options = args[1] if len(args) == 2 else {}
        if not isinstance(options, dict):
            raise Refusal("authenticate's options must be a mapping", codes.BAD_REQUEST)
        since = options.get("since")
        if since is not None and not isinstance(since, str):
            raise Refusal("since must be a position (a string)", codes.BAD_REQUEST)
        if token is None and connection.outbound.anonymous_criteria is not None:
            return None, options
    if token is None or token == "":
        raise Refusal("authenticate needs a token", codes.BAD_REQUEST)
    return token, options


async def _caught_up(history: History, since: Any, wait: float = 1.0) -> None:
    """Let the consumer reach ``since`` (a backend may hand out a 204's position before this
    instance has read it), for at most ``wait`` seconds; recovery then judges it."""
    if not isinstance(since, str) or history.last is None:
        return
    deadline = time.monotonic() + wait
    while history.ahead(since) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
