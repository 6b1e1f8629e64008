"""Messages to the backplane: each encoded, and those a ``[[history]]`` rule keeps sent with
their :class:`~bow_gateway.core.retention.Retention`, so that the backplane keeps them in their
topic's history in the same step (one trip for a whole batch)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from ..backplanes import Backplane, Claim
from ..core.message import MessageEvent, encode_event
from ..core.retention import Retentions


class Publisher:
    """Publishes message events: :meth:`positions` for the inbounds, :meth:`published` for those
    who also want each kept message's sequence (Gobbler's ``#send``)."""

    def __init__(self, backplane: Backplane, retentions: Retentions | None = None) -> None:
        self._backplane = backplane
        self._retentions = retentions or Retentions()

    def positions(
        self, events: Sequence[MessageEvent], claim: Claim | None = None
    ) -> Awaitable[list[str]]:
        """The events' positions, once published (the backplane's own awaitable when no history
        rule applies: no layer of this one in every request in flight); with a ``claim``, or
        :class:`~bow_gateway.backplanes.AlreadyAccepted`."""
        if not self._retentions:
            data = [encode_event(event) for event in events]
            return self._backplane.publish_many(data, claim)
        return self._retained_positions(events, claim)

    async def _retained_positions(
        self, events: Sequence[MessageEvent], claim: Claim | None
    ) -> list[str]:
        return [position for position, _ in await self.published(events, claim)]

    async def published(
        self, events: Sequence[MessageEvent], claim: Claim | None = None
    ) -> list[tuple[str, int | None]]:
        """Each event's position and, when a history rule keeps it, its sequence."""
        data = [encode_event(event) for event in events]
        kept = [self._retentions.of(event.message.name) for event in events]
        if not any(kept):
            published = await self._backplane.publish_many(data, claim)
            return [(position, None) for position in published]
        return await self._backplane.publish_retained(list(zip(data, kept, strict=True)), claim)
