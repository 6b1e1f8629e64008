"""The consumer: every backplane event, in order, into the recovery history and then to this
instance's sockets (messages, control changes, counts, gaps)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Final

from ..backplanes import Backplane, Entry, Gap
from ..core.history import History
from ..core.index import entries_of
from ..core.message import (
    CountEvent,
    CriteriaEvent,
    Event,
    KickEvent,
    MessageEvent,
    PresenceEvent,
    SetCriteriaEvent,
    count_answer,
    decode_event,
)
from ..runtime.metrics import Metrics
from ..seams.prometheus import StepHistogram
from . import SocketOutbound
from .presence import presence_answer

logger = logging.getLogger("bow_gateway")

LAG_EVERY: Final = 0.01  # seconds between two settings of bow_backplane_lag_seconds


class Consumer:
    """Reads ``backplane.events()`` and applies each one; a bad event is logged and skipped."""

    def __init__(
        self,
        backplane: Backplane,
        outbound: SocketOutbound,
        history: History,
        metrics: Metrics,
        *,
        middleware_versions: Iterable[str] = (),
        count_max_ids: int = 10_000,
    ) -> None:
        self._backplane = backplane
        self._outbound = outbound
        self._history = history
        self._metrics = metrics
        self._versions = list(middleware_versions)
        self._count_max_ids = count_max_ids
        self._lag_due = 0.0  # when bow_backplane_lag_seconds is set next
        self._latency = StepHistogram(metrics.latency_seconds)

    def preload(self, backlog: list[Entry], *, complete: bool) -> None:
        """Fill the history with what the backplane held at start; ``complete``: the backlog
        reaches back to its epoch's origin, so a position from that origin still recovers."""
        history, backplane = self._history, self._backplane
        origin = backplane.origin()
        if (complete or not backlog) and origin is not None:
            history.restart(origin)  # a client can keep this position before any message
        for entry in backlog:
            self.remember(entry.position, decode_event(entry.data), entry.data)
        history.delivered = history.last

    async def run(self) -> None:
        """Until the backplane ends its events."""
        history, delivery = self._history, self._outbound.delivery
        async for entry in self._backplane.events():
            if isinstance(entry, Gap):
                history.restart(entry.position)
                delivery.gap(entry.position, entry.reason)
            else:
                try:
                    await self._apply(entry)
                except Exception:  # one bad event must not stop delivery of the next ones
                    logger.exception("could not deliver an event")
            history.delivered = entry.position

    async def _apply(self, entry: Entry) -> None:
        metrics = self._metrics
        event = decode_event(entry.data)
        accepted_at = event.accepted_at if isinstance(event, MessageEvent) else 0.0
        if accepted_at:
            now = time.time()
            if now >= self._lag_due:  # a gauge read every few seconds: set 100 times a second
                self._lag_due = now + LAG_EVERY
                metrics.backplane_lag_seconds.set(max(0.0, now - accepted_at))
        self.remember(entry.position, event, entry.data)  # first: a recovery meanwhile ends here
        if isinstance(event, CountEvent):
            answer = count_answer(
                self._outbound.delivery.count(event.audience), self._count_max_ids
            )
            self._outbound.spawn(self._backplane.answer(event.request_id, answer))
            return
        if isinstance(event, PresenceEvent):
            answer = presence_answer(self._outbound.indices, event)
            self._outbound.spawn(self._backplane.answer(event.request_id, answer))
            return
        await self._outbound.delivery.deliver(entry.position, event)
        if accepted_at:
            self._latency.observe(max(0.0, time.time() - accepted_at))

    def remember(self, position: str, event: Event, data: bytes | None = None) -> None:
        """Keep an event in the recovery window (a message as ``data``, the bytes it was decoded
        from, when given), and the listener changes it carries."""
        history = self._history
        accepted_at = event.accepted_at if isinstance(event, MessageEvent) else None
        history.append(position, event, accepted_at, data)
        changes = history.changes
        if isinstance(event, CriteriaEvent):
            entries = entries_of(event.criteria)
            changes.note_criteria(position, event.middleware_version, event.listener_id, entries)
        elif isinstance(event, SetCriteriaEvent):
            for listener_id, criteria in event.changes:
                changes.note_control(position, listener_id, "criteria", criteria)
                for version in self._versions:
                    changes.note_criteria(position, version, listener_id, entries_of(criteria))
        elif isinstance(event, KickEvent):
            for listener_id in event.ids:
                changes.note_control(position, listener_id, "kick", event)
