"""The Web Push connector's Prometheus metrics, on the gateway's registry beside the webhooks'
(whose ``bow_webhook_*`` count its events under ``webhook="webpush"``)."""

from __future__ import annotations

from prometheus_client import Counter

from ...runtime.metrics import Metrics


class WebPushMetrics:
    """Pushes a push service took, attempts that failed by status, subscriptions removed."""

    def __init__(self, metrics: Metrics) -> None:
        registry = metrics.registry
        self.sent = Counter(
            "bow_webpush_sent",
            "Web Pushes a push service accepted (2xx).",
            registry=registry,
        )
        self.failed = Counter(
            "bow_webpush_failed",
            "Web Push attempts that failed, by status (the HTTP status, or error: no answer),"
            " retried or not; 404 and 410 count as subscriptions removed instead.",
            ["status"],
            registry=registry,
        )
        self.removed = Counter(
            "bow_webpush_subscriptions_removed",
            "Push subscriptions removed by the gateway, by reason: 404 or 410 (the push service"
            " says it is gone), dropped (the oldest of a listener past its bound).",
            ["reason"],
            registry=registry,
        )
