"""``replay`` (``clients.md`` section 14): a protocol-2 socket asks for a topic's history.

``replay({"topic", "start", "max_count"}, ack)``: the replayed events (``meta.sequence`` and
``meta.replayed: true``) are written as fast as the socket reads them, live delivery going on
meanwhile; then the ack receives ``{"count": n}``, or ``{"error": {"code": 4000, "reason":
"bad_request", "text"}}`` when the request is refused (``4011``, ``too_many_requests``, over
``recovery.max_replays_per_minute`` for the socket or its listener id). One replay at a time per
socket.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from ..core import codes
from ..core.names import GATEWAY_PREFIX
from ..core.topics import is_system_name
from . import codec
from .connection import Connection, logger
from .parts import Sockets
from .topic_replay import MAX_COUNT, TopicHistory
from .writer import REPLAY_LOW_WATER

KEYS: Final = frozenset({"topic", "start", "max_count"})


class BadReplay(ValueError):
    """A ``replay`` refused as a whole: its text goes to the ack."""

    code = codes.BAD_REQUEST


class TooManyReplays(BadReplay):
    """Over ``recovery.max_replays_per_minute``: the client retries later."""

    code = codes.TOO_MANY_REQUESTS


class Replays:
    """Runs the ``replay`` events of protocol-2 sockets."""

    def __init__(self, outbound: Sockets, history: TopicHistory | None) -> None:
        self._outbound = outbound
        self._history = history
        self._busy: set[Connection] = set()

    async def replay(self, connection: Connection, args: list[Any], ack_id: Any) -> None:
        outbound = self._outbound
        if not connection.codec.coded or connection.closing is not None:
            return
        try:
            topic, start, max_count = self._request(connection, args)
        except BadReplay as error:
            logger.info("socket %s: replay refused: %s", connection.sid, error)
            self._ack(connection, ack_id, _error(str(error), error.code))
            return
        assert self._history is not None
        self._busy.add(connection)
        count = 0
        try:
            begin, most = await self._history.span(topic, start, max_count)
            replayed = self._history.replay(outbound, connection, topic, begin, most)
            async for events in replayed:
                for event in events:
                    while outbound.writer.buffered(connection) > REPLAY_LOW_WATER:
                        if connection.closing is not None:
                            return
                        await asyncio.sleep(0.005)
                    packet = connection.codec.replayed(event, "")
                    if not outbound.writer.write(connection, packet):
                        return
                    count += 1
        except Exception as error:  # noqa: BLE001 - Redis unreachable: the socket is told
            logger.warning("socket %s: replay of %r failed: %s", connection.sid, topic, error)
            self._ack(connection, ack_id, _error("the history cannot be read now: retry later"))
            return
        finally:
            self._busy.discard(connection)
        outbound.metrics.replayed.inc(count)
        self._ack(connection, ack_id, {"count": count})

    def _request(self, connection: Connection, args: list[Any]) -> tuple[str, int, int | None]:
        if self._history is None:
            raise BadReplay("this gateway keeps no topic history ([[history]])")
        if len(args) != 1 or not isinstance(args[0], dict):
            raise BadReplay(
                'replay takes one argument, {"topic", "start", "max_count"}, and an ack'
            )
        request = args[0]
        unknown = sorted(str(key)[:32] for key in request if key not in KEYS)
        if unknown:
            raise BadReplay(f"unknown key {unknown[0]!r}: replay takes topic, start, max_count")
        topic = request.get("topic")
        if (
            not isinstance(topic, str)
            or not topic
            or is_system_name(topic)
            or topic.startswith(GATEWAY_PREFIX)
        ):
            raise BadReplay("topic must be a message name")
        if {"+", "#"} & set(topic.split("/")):
            raise BadReplay("topic must be a message name, not a filter (no + or # level)")
        if not self._history.kept(topic):
            raise BadReplay(f"{topic[:64]!r} keeps no history (no [[history]] filter matches it)")
        start = request.get("start", 0)
        if isinstance(start, bool) or not isinstance(start, int) or start < -MAX_COUNT:
            raise BadReplay(
                f"start must be a sequence, or a count of the last (-1 to -{MAX_COUNT})"
            )
        max_count = request.get("max_count")
        if max_count is not None and (
            isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 0
        ):
            raise BadReplay("max_count must be a count (0 or more)")
        if not connection.authenticated:
            raise BadReplay("authenticate first")
        if connection in self._busy:
            raise BadReplay("a replay is under way on this socket: one at a time")
        rate = self._history.limit
        if not rate.take(connection):
            raise TooManyReplays(
                f"over {rate.per_minute} replays a minute (recovery.max_replays_per_minute)"
            )
        limit = MAX_COUNT if max_count is None else min(max_count, MAX_COUNT)
        return topic, start, limit

    def _ack(self, connection: Connection, ack_id: Any, result: dict[str, Any]) -> None:
        if ack_id is not None:
            packet = codec.ack(ack_id, result, proto=2)
            self._outbound.writer.write(connection, packet)


def _error(text: str, code: codes.Code = codes.BAD_REQUEST) -> dict[str, Any]:
    return {"error": {"code": code.code, "reason": code.reason, "text": text}}
