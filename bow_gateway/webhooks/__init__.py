"""Webhooks (contract section 19): events stored, then delivered to the configured receivers
with Standard Webhooks signatures, retried, dead-lettered, replayed. :mod:`.service` is what the
gateway uses; :mod:`.store_redis` documents the Redis layout other scripts append to."""

from __future__ import annotations

from collections.abc import Sequence

from ..backplanes import Backplane
from ..core.webhook_settings import EVENT_TYPES, Webhook
from ..runtime.audience_index import AudienceIndex
from ..runtime.config import Config
from ..runtime.metrics import Metrics
from .connectors import Connector
from .events import WebhookEvent
from .online import OFFLINE, ONLINE, MemoryOnline, Online, RedisOnline
from .receipt_events import ReceiptEvents
from .service import Webhooks
from .store_memory import MemoryWebhookStore

__all__ = [
    "EVENT_TYPES",
    "Connector",
    "Online",
    "ReceiptEvents",
    "Webhook",
    "WebhookEvent",
    "Webhooks",
    "online_from",
    "receipt_events_from",
    "webhooks_from_config",
]


def webhooks_from_config(
    config: Config, metrics: Metrics, connectors: Sequence[Connector] = ()
) -> Webhooks:
    """The webhooks of ``config`` and the ``connectors`` beside them: stored in Redis when the
    gateway has it (the backplane's settings and namespace), in this process otherwise, or
    without webhooks nor connectors."""
    if config.redis is None or not (config.webhooks or connectors):
        return Webhooks(config.webhooks, MemoryWebhookStore(), metrics, connectors=connectors)
    from .store_redis import RedisWebhookStore  # redis-py only for a gateway that uses it

    store = RedisWebhookStore(
        config.redis,
        namespace=config.namespace,
        write_timeout=float(config.backplane.get("publish_timeout", 2.0)),
    )
    return Webhooks(config.webhooks, store, metrics, connectors=connectors)


def online_from(config: Config, webhooks: Webhooks, backplane: Backplane) -> Online | None:
    """What tells ``listener.online`` and ``listener.offline`` (None: no webhook takes them):
    in Redis, beside the webhook store, when the gateway has it; in this process otherwise."""
    if not (webhooks.wants(ONLINE) or webhooks.wants(OFFLINE)):
        return None
    grace = config.offline_grace
    store = webhooks.store
    if config.redis is not None:  # redis-py only for a gateway that uses it
        from ..backplanes.redis import RedisBackplane
        from .store_redis import RedisWebhookStore

        assert isinstance(store, RedisWebhookStore) and isinstance(backplane, RedisBackplane)
        return RedisOnline(
            store.client,
            config.namespace,
            backplane.instance_id,
            instances_key=f"{{{config.namespace}}}:instances",
            live_for=backplane.live_for,
            max_backlog=store.max_backlog,
            max_dead=store.max_dead,
            grace=grace,
        )
    return MemoryOnline(webhooks.emit, grace=grace)


def receipt_events_from(
    config: Config, webhooks: Webhooks, backplane: Backplane, index: AudienceIndex | None = None
) -> ReceiptEvents | None:
    """What stores ``message.receipt`` and ``message.undelivered`` once a receipt is final
    (None: no webhook takes them); with the audience ``index``, over the whole base."""
    events = ReceiptEvents(
        backplane,
        webhooks,
        max_ids=config.receipts_max_ids,
        ttl=config.receipts_ttl,
        index=index,
        max_listeners=config.fallback_max_listeners,
    )
    return events if events.wanted() else None
