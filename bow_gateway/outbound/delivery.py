"""Delivery: each backplane event applied to this instance's sockets, in order.

A message is resolved once, encoded once per codec (the connection's wire protocol: Socket.IO
protocol 1 or 2, ...), and the same bytes are written to every matching connection of that codec;
control events replace criteria or kick.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from typing import Any, Final

from ..core import codes
from ..core.criteria import ID_KEY, ListenerId
from ..core.index import Query
from ..core.message import CriteriaEvent, Event, KickEvent, MessageEvent, SetCriteriaEvent
from ..core.names import DISCONNECT, session_of
from ..core.topics import is_system_name
from ..seams.prometheus import StepCounter, StepHistogram
from . import codec
from .codec import Codec, Encoded
from .connection import Connection, logger
from .parts import Sockets

YIELD_EVERY: Final = 1_000  # sockets written between two yields to the event loop


class Delivery:
    """Applies backplane events to the sockets of :class:`~.sockets.SocketOutbound`."""

    def __init__(self, outbound: Sockets) -> None:
        self._outbound = outbound
        self._delivered: dict[str, StepCounter] = {}  # bow_deliveries_total, by protocol
        self._resolution = StepHistogram(outbound.metrics.resolution_seconds)

    async def deliver(self, position: str, event: Event) -> None:
        """Apply one backplane event, read at ``position``: a message, or a control change."""
        if isinstance(event, MessageEvent):
            await self._deliver_message(position, event)
        elif isinstance(event, CriteriaEvent):
            index = self._outbound.indices.get(event.middleware_version)
            changes = self._outbound.history.changes
            basis = event.basis
            if index is not None and (
                basis is None or not changes.control_after(basis, event.listener_id)
            ):
                index.update(event.listener_id, event.criteria)  # else a control change wins
        elif isinstance(event, SetCriteriaEvent):
            for listener_id, criteria in event.changes:
                for index in self._outbound.indices.values():
                    index.update(listener_id, {**criteria, ID_KEY: listener_id})
        elif isinstance(event, KickEvent):
            self._outbound.metrics.kicks.inc(len(event.ids))
            for connection in self._sockets_of(event.ids):
                self._outbound.close(
                    connection, codes.KICKED, event.reason or "kicked", reconnect=event.reconnect
                )

    def _sockets_of(self, listener_ids: list[ListenerId]) -> list[Connection]:
        return [
            connection
            for index in self._outbound.indices.values()
            for listener_id in listener_ids
            if not isinstance(listener_id, bool)
            for connection in list(index.sockets_of(listener_id))
        ]

    def count(self, audience: list[Query]) -> tuple[int, set[ListenerId]]:
        """Authenticated sockets of this instance whose criteria match ``audience`` now, and
        the distinct ids among them."""
        sockets = 0
        ids: set[ListenerId] = set()
        for index in self._outbound.indices.values():
            for connection in index.resolve(audience):
                sockets += 1
                if connection.listener_id is not None:
                    ids.add(connection.listener_id)
        return sockets, ids

    async def _deliver_message(self, position: str, event: MessageEvent) -> None:
        index = self._outbound.indices.get(event.middleware_version)
        if index is None:
            return
        started = time.perf_counter()
        connections = index.resolve(event.message.audience)
        self._resolution.observe(time.perf_counter() - started)
        if not connections and not event.receipt:
            return
        message = event.message
        topics = self._outbound.topics[event.middleware_version]
        if is_system_name(message.name):  # $remote/{sessionId}/rx/...: that session alone
            bound = self._outbound.sessions.bound.get(session_of(message.name), set())
            connections = connections & bound
        elif topics.holders and message.name != DISCONNECT:  # once a socket holds a filter
            connections = topics.narrow(connections, message.name)
        if message.name == DISCONNECT:
            self._disconnect(connections)
            return
        if event.receipt:
            await self._deliver_asking(position, event, connections)
            return
        # Encoded once per codec (not per connection); connections of one codec usually come
        # in runs, so the cache is looked up only when the codec changes.
        encodings: dict[Codec, Encoded] = {}
        last: Codec | None = None
        positioned = False
        encoded = frame = b""
        write = self._outbound.writer.write
        written = 0
        counts: dict[str, int] = {}
        now = time.monotonic()
        for connection in connections:
            connection_codec = connection.codec
            if connection_codec is not last:
                if last is not None:
                    counts[last.protocol] = counts.get(last.protocol, 0) + written
                    written = 0
                last = connection_codec
                positioned = connection_codec.positioned
                cached = encodings.get(connection_codec)
                if cached is None:
                    cached = encodings[connection_codec] = connection_codec.message(event, position)
                encoded, frame = cached
            if positioned:
                connection.positioned_at = now
            if not write(connection, encoded, frame):
                continue
            written += 1
            if written % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        if last is not None:
            counts[last.protocol] = counts.get(last.protocol, 0) + written
        self._count(counts)

    async def _deliver_asking(
        self, position: str, event: MessageEvent, connections: Collection[Connection]
    ) -> None:
        """A message that asked for a receipt (section 17): each delivery noted, and protocol-2
        sockets asked to acknowledge it (one acknowledgement id for all: encoded once)."""
        receipts = self._outbound.receipts
        tracked = receipts.track(event, position, len(connections))
        encodings: dict[Codec, Encoded] = {}
        write = self._outbound.writer.write
        counts: dict[str, int] = {}
        now = time.monotonic()
        for seen, connection in enumerate(connections, 1):
            connection_codec = connection.codec
            asks = tracked is not None and connection_codec.acknowledges
            cached = encodings.get(connection_codec)
            if cached is None:
                ack_id = tracked.ack_id if tracked is not None and asks else 0
                cached = encodings[connection_codec] = connection_codec.message(
                    event, position, ack_id
                )
            if connection_codec.positioned:
                connection.positioned_at = now
            if write(connection, *cached):
                protocol = connection_codec.protocol
                counts[protocol] = counts.get(protocol, 0) + 1
                if tracked is not None:
                    receipts.delivered(tracked, connection, asks)
            if seen % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        self._count(counts)

    def _disconnect(self, connections: Collection[Connection]) -> None:
        """A ``__disconnect`` message: each of ``connections`` closed (coded or not)."""
        for connection in connections:
            if connection.codec.coded:
                self._outbound.close(
                    connection,
                    codes.DISCONNECT_MESSAGE,
                    "a __disconnect message",
                    kind="disconnect message",
                )
            elif connection.closing is None:
                connection.closing = "disconnect message"
                self._outbound.spawn(self._outbound.disconnect_soon(connection))

    def _count(self, counts: dict[str, int]) -> None:
        """``bow_deliveries_total``, by protocol."""
        for protocol, count in counts.items():
            counter = self._delivered.get(protocol)
            if counter is None:
                counter = self._delivered[protocol] = StepCounter(
                    self._outbound.metrics.deliveries.labels(protocol)
                )
            counter.inc(count)

    def gap(self, position: str, reason: str) -> None:
        """The history broke: every protocol-2 socket gets ``__gap``; protocol 1 cannot be told."""
        self._outbound.metrics.gaps.labels(reason).inc()
        packets = _Packets(codec.GAP_EVENT, {"position": position, "reason": reason})
        for connection in list(self._outbound.positioned):
            connection.positioned_at = time.monotonic()
            self._outbound.writer.write(connection, packets[connection.codec])
        others = len(self._outbound.connections) - len(self._outbound.positioned)
        if others:
            logger.warning(
                "the history broke (%s): %d protocol-1 sockets may have missed messages",
                reason,
                others,
            )

    async def tell_positions(self) -> None:
        """Forever: ``__position`` to each protocol-2 socket sent nothing positioned for
        ``position_interval`` seconds, so that it can recover after the window moved on."""
        interval = self._outbound.settings.position_interval
        while True:
            await asyncio.sleep(interval / 4)
            position = self._outbound.history.delivered
            if position is None:
                continue
            packets = _Packets(codec.POSITION_EVENT, {"position": position})
            now = time.monotonic()
            for written, connection in enumerate(list(self._outbound.positioned), 1):
                if now - connection.positioned_at >= interval:
                    connection.positioned_at = now
                    self._outbound.writer.write(connection, packets[connection.codec])
                if written % YIELD_EVERY == 0:
                    await asyncio.sleep(0)


class _Packets(dict[Codec, bytes]):
    """A gateway event (``__gap``, ``__position``) encoded once per codec, on first use."""

    def __init__(self, name: str, meta: dict[str, Any]) -> None:
        super().__init__()
        self._name = name
        self._meta = meta

    def __missing__(self, key: Codec) -> bytes:
        packet = self[key] = key.gateway_event(self._name, self._meta)
        return packet
