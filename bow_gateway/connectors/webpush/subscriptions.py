"""What ``/_bow/push-subscriptions`` does (contract section 20): a browser's subscription stored
for a listener, checked; removed by endpoint, by listener, or both."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .metrics import WebPushMetrics
from .store import SubscriptionStore
from .subscription import check_endpoint, listener_key, parsed_subscription

logger = logging.getLogger("bow_gateway.webpush")


class Subscriptions:
    """The subscriptions of ``store``; ``allow_http_loopback`` lets ``http://127.0.0.1`` in."""

    def __init__(
        self, store: SubscriptionStore, metrics: WebPushMetrics, *, allow_http_loopback: bool
    ) -> None:
        self.store = store
        self._metrics = metrics
        self._allow_http_loopback = allow_http_loopback

    async def subscribe(self, body: Any) -> dict[str, Any]:
        """``{"id", "subscription"}`` stored: ``{"stored": true, "dropped": n}`` (n of the
        listener's oldest dropped for it). ``ValueError`` naming what is wrong."""
        if not isinstance(body, Mapping) or set(body) != {"id", "subscription"}:
            raise ValueError('the body must be {"id": listener id, "subscription": {...}}')
        key = listener_key(body["id"])
        subscription = parsed_subscription(body["subscription"], self._allow_http_loopback)
        dropped = await self.store.add(key, subscription)
        if dropped:
            self._metrics.removed.labels("dropped").inc(len(dropped))
            logger.info("dropped %d older push subscriptions of a listener", len(dropped))
        return {"stored": True, "dropped": len(dropped)}

    async def unsubscribe(self, body: Any) -> dict[str, Any]:
        """``{"endpoint"}`` (wherever it is), ``{"id", "endpoint"}`` (only if it is that
        listener's) or ``{"id"}`` (all of the listener's) removed: ``{"removed": n}``."""
        if not isinstance(body, Mapping) or not body or not set(body) <= {"id", "endpoint"}:
            raise ValueError('the body must be {"endpoint": ...}, {"id", "endpoint"} or {"id"}')
        key = listener_key(body["id"]) if "id" in body else None
        if "endpoint" not in body and key is not None:
            return {"removed": await self.store.remove_listener(key)}
        endpoint = check_endpoint(body["endpoint"], self._allow_http_loopback)
        return {"removed": await self.store.remove(endpoint, key)}
