"""Prometheus metrics of one instance, with prometheus-client, served at ``GET /metrics``.

Each ``Bow`` has a registry of its own, so that several gateways in one process never mix their
figures. Under ``serve --workers N`` (``PROMETHEUS_MULTIPROC_DIR`` set), prometheus-client's
multiprocess mode adds the workers' figures up, whichever worker answers the scrape.
"""

from __future__ import annotations

import os
from typing import Final

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

MULTIPROCESS_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"

# From 50 µs (a small audience) to 10 s (a stalled Redis).
_LATENCY_BUCKETS: Final = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class Metrics:
    """Every metric the gateway exports; the engine only counts, it never reads them back."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._add_connection_metrics()
        self._add_message_metrics()
        self._add_protocol_metrics()
        self._add_webhook_metrics()

    def _add_connection_metrics(self) -> None:
        """Connections and sockets: open, held as listeners, authenticated, disconnected."""
        self.connections_open = Gauge(
            "bow_connections_open",
            "Engine.IO connections open, from their first request, authenticated or not.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.sockets_connected = Gauge(
            "bow_sockets_connected",
            "Client connections open (Socket.IO, SSE, Flywheel), by outbound version and protocol.",
            ["outbound", "protocol"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.sockets_authenticated = Gauge(
            "bow_sockets_authenticated",
            "Connections held as listeners (authenticated or anonymous), by outbound version and"
            " protocol.",
            ["outbound", "protocol"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.authentications = Counter(
            "bow_authentications",
            "Authentication attempts, by outbound version and outcome.",
            ["outbound", "outcome"],
            registry=self.registry,
        )
        self.disconnects = Counter(
            "bow_disconnects",
            "Sockets disconnected, by reason.",
            ["reason"],
            registry=self.registry,
        )

    def _add_message_metrics(self) -> None:
        """Messages in and out: accepted, refused, delivered, how fast; the loop and its tasks."""
        self.messages_accepted = Counter(
            "bow_messages_accepted",
            "Messages answered 204, by inbound path.",
            ["inbound"],
            registry=self.registry,
        )
        self.messages_refused = Counter(
            "bow_messages_refused",
            "Messages refused, by inbound path and HTTP status.",
            ["inbound", "status"],
            registry=self.registry,
        )
        self.deliveries = Counter(
            "bow_deliveries",
            "Events written to connections, by protocol.",
            ["protocol"],
            registry=self.registry,
        )
        self.resolution_seconds = Histogram(
            "bow_audience_resolution_seconds",
            "Time to resolve one message's audience against the criteria index.",
            registry=self.registry,
            buckets=_LATENCY_BUCKETS,
        )
        self.latency_seconds = Histogram(
            "bow_delivery_latency_seconds",
            "From a message's acceptance by an inbound to its frames queued on every socket.",
            registry=self.registry,
            buckets=_LATENCY_BUCKETS,
        )
        self.loop_lag_seconds = Histogram(
            "bow_event_loop_lag_seconds",
            "How late the event loop ran a timer (sampled 4 times a second): the longest stall"
            " that heartbeats, HTTP and deliveries waited.",
            registry=self.registry,
            buckets=_LATENCY_BUCKETS,
        )
        self.task_restarts = Counter(
            "bow_task_restarts",
            "Background tasks that died and were restarted, by task.",
            ["task"],
            registry=self.registry,
        )

    def _add_protocol_metrics(self) -> None:
        """Protocol 2 and the clients' protocols: recoveries, gaps, expiries, publishes, closes."""
        self.recoveries = Counter(
            "bow_recoveries",
            "Protocol-2 recoveries (authenticate with since), by outcome and reason.",
            ["outcome", "reason"],
            registry=self.registry,
        )
        self.replayed = Counter(
            "bow_replayed_messages",
            "Messages replayed to recovering sockets.",
            registry=self.registry,
        )
        self.gaps = Counter(
            "bow_gaps",
            "Times the history broke under this instance (epoch_changed, trimmed).",
            ["reason"],
            registry=self.registry,
        )
        self.refreshes = Counter(
            "bow_refreshes", "Protocol-2 re-authentications that succeeded.", registry=self.registry
        )
        self.expiries = Counter(
            "bow_expiries", "Sockets closed at exp + grace (4003).", registry=self.registry
        )
        self.subscribes = Counter(
            "bow_subscribes",
            "Protocol-2 subscribe events, by result (ok, error).",
            ["result"],
            registry=self.registry,
        )
        self.client_publishes = Counter(
            "bow_client_publishes",
            "Messages published by clients (Flywheel's P frames), by protocol and outcome.",
            ["protocol", "outcome"],
            registry=self.registry,
        )
        self.kicks = Counter(
            "bow_kicks", "Listener ids kicked by POST /_bow/disconnect.", registry=self.registry
        )
        self.limit_hits = Counter(
            "bow_closes",
            "Sockets closed by the gateway with a code of section 10, by code.",
            ["code"],
            registry=self.registry,
        )
        self.backplane_lag_seconds = Gauge(
            "bow_backplane_lag_seconds",
            "Age of the last event read from the backplane when it was read.",
            registry=self.registry,
            multiprocess_mode="max",
        )

    def _add_webhook_metrics(self) -> None:
        """Webhooks (section 19): requests by webhook (its index in ``[[webhooks]]``, never its
        URL) and outcome, dead letters, the backlog refused, the queue's depth."""
        self.webhook_requests = Counter(
            "bow_webhook_requests",
            "Webhook requests by webhook (its index in [[webhooks]]) and outcome: delivered (2xx),"
            " retried (to be tried again), dead (made a dead letter).",
            ["webhook", "outcome"],
            registry=self.registry,
        )
        self.webhook_dead_letters = Counter(
            "bow_webhook_dead_letters",
            "Dead letters made, by webhook: failed deliveries, events refused at the backlog"
            " bound.",
            ["webhook"],
            registry=self.registry,
        )
        self.webhook_backlog_full = Counter(
            "bow_webhook_backlog_full",
            "Webhook events refused because max_backlog events were waiting (made dead letters).",
            registry=self.registry,
        )
        self.webhook_queue_depth = Gauge(
            "bow_webhook_queue_depth",
            "Webhook events waiting, as the delivering instance last saw them (0 elsewhere).",
            registry=self.registry,
            multiprocess_mode="max",
        )

    def exposition(self) -> bytes:
        """The text format of every metric (of every worker, in multiprocess mode)."""
        if os.environ.get(MULTIPROCESS_ENV):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)

    async def handle(self, request: web.Request) -> web.Response:
        """``GET /metrics``."""
        return web.Response(body=self.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})
