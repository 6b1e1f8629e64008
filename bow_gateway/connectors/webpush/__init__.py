"""The Web Push connector (contract section 20): browsers' push subscriptions stored by listener
(``/_bow/push-subscriptions``, :mod:`.subscriptions`), and each ``message.undelivered`` event of
the webhook engine pushed to them, encrypted (:mod:`.connector`). Configured by ``[webpush]``
(:mod:`bow_gateway.core.webpush_settings`); docs/webpush.md tells how to use it."""

from __future__ import annotations

from ...runtime.config import Config
from ...runtime.metrics import Metrics
from .connector import WebPush
from .metrics import WebPushMetrics
from .store import MemorySubscriptions, SubscriptionStore
from .subscriptions import Subscriptions

__all__ = ["Subscriptions", "WebPush", "webpush_from_config"]


def webpush_from_config(config: Config, metrics: Metrics) -> WebPush | None:
    """The connector (its ``subscriptions`` those of the control endpoints) when ``[webpush]``
    is configured, None otherwise: subscriptions in Redis when the gateway has it, in this
    process otherwise."""
    settings = config.webpush
    if settings is None:
        return None
    store: SubscriptionStore
    if config.redis is None:
        store = MemorySubscriptions(
            max_per_listener=settings.max_subscriptions_per_listener,
            max_total=settings.max_subscriptions,
        )
    else:
        from .store_redis import RedisSubscriptions  # redis-py only for a gateway that uses it

        store = RedisSubscriptions(
            config.redis,
            namespace=config.namespace,
            max_per_listener=settings.max_subscriptions_per_listener,
            max_total=settings.max_subscriptions,
            timeout=float(config.backplane.get("publish_timeout", 2.0)),
        )
    return WebPush(settings, store, WebPushMetrics(metrics))
