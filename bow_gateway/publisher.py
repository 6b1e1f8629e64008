"""Messages to the backplane: each encoded, and those a ``[[history]]`` rule keeps sent with
their :class:`~.backplanes.Retention`, so that the backplane keeps them in their topic's history
in the same step (one trip for a whole batch)."""

from __future__ import annotations

from collections.abc import Sequence

from .backplanes import Backplane
from .message import MessageEvent, encode_event
from .retention import Retentions


class Publisher:
    """Publishes message events: :meth:`positions` for the inbounds, :meth:`published` for those
    who also want each kept message's sequence (Gobbler's ``#send``)."""

    def __init__(self, backplane: Backplane, retentions: Retentions | None = None) -> None:
        self._backplane = backplane
        self._retentions = retentions or Retentions()

    async def positions(self, events: Sequence[MessageEvent]) -> list[str]:
        if not self._retentions:
            return await self._backplane.publish_many([encode_event(event) for event in events])
        return [position for position, _ in await self.published(events)]

    async def published(self, events: Sequence[MessageEvent]) -> list[tuple[str, int | None]]:
        """Each event's position and, when a history rule keeps it, its sequence."""
        data = [encode_event(event) for event in events]
        kept = [self._retentions.of(event.message.name) for event in events]
        if not any(kept):
            return [(position, None) for position in await self._backplane.publish_many(data)]
        return await self._backplane.publish_retained(list(zip(data, kept, strict=True)))
