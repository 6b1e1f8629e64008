"""``Bow``'s embedded twins of the webhooks' control endpoints (contract section 19), a mixin so
that the server module stays the lifecycle's."""

from __future__ import annotations

from typing import Any

from ..webhooks import Webhooks


class WebhooksApi:
    """``webhooks_dead`` and ``webhooks_replay``, on the gateway's ``_webhooks`` once started."""

    _webhooks: Webhooks | None
    _stopping: bool

    def _started_webhooks(self) -> Webhooks:
        if self._webhooks is None or self._stopping:
            raise RuntimeError("this Bow is not started")
        return self._webhooks

    async def webhooks_dead(self, limit: int = 100) -> list[dict[str, Any]]:
        """``GET /_bow/webhooks/dead?limit=``: the oldest ``limit`` (1 to 10,000) dead letters,
        oldest first; ``ValueError`` for another limit."""
        return await self._started_webhooks().dead(limit)

    async def webhooks_replay(self, ids: list[str]) -> int:
        """``POST /_bow/webhooks/replay``: these webhook-ids' dead letters queued again (with the
        same ids); how many were."""
        return await self._started_webhooks().replay(ids)
