"""The gateway's configuration (section 1 of the contract): :class:`Config`, loaded from a mapping
that :mod:`.config_schema` checks."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from marshmallow import ValidationError

from ..core.criteria import error_text
from ..core.retention import HistoryRule, history_rules
from ..core.webhook_settings import Webhook, webhook_settings
from ..core.webpush_settings import WebPushSettings, webpush_settings
from .config_schema import _ConfigSchema
from .protocol_paths import declared


@dataclass(frozen=True)
class Config:
    """The checked configuration of one gateway instance."""

    port: int
    host: str
    https: ssl.SSLContext | dict[str, Any] | None
    redis: Any
    namespace: str
    reuse_port: bool
    gc_freeze: bool
    drain_timeout: float
    backplane: dict[str, Any]
    metrics_port: int | None
    metrics_auth: bool
    log_interval: float | None
    realm: str
    username: str
    password: str
    max_body_size: int
    inbound_timeout: float
    max_queries: int
    max_predicates: int
    http_timeout: float
    auth_timeout: float
    max_buffered_bytes: int
    max_incoming_bytes: int
    max_sockets: int
    max_connects_per_second: float
    transports: list[str]
    cors_origins: list[str]
    """Origins of pages that may connect across origins; ``["*"]`` for any, ``[]`` for none."""
    expiry_grace: float = 25.0
    expire_v1_sockets: bool = False
    max_event_bytes: int = 262_144
    max_sockets_per_id: int = 100
    max_authenticates_per_minute: int = 12
    max_filters: int = 100
    max_filters_per_id: int = 1_000
    """Distinct topic filters of one listener id's connections on an instance (anonymous and
    not yet authenticated connections count as one id)."""
    max_filters_per_instance: int = 200_000
    """Topic filters held on an instance, each counted once per connection holding it."""
    max_publishes_per_second: int = 100
    endpoint_paths: Mapping[str, str | None] = field(default_factory=dict)
    """Each client protocol's endpoint (``outbound.{name}_path``), by protocol name; None (or
    ``""``): none."""
    recovery_enabled: bool = True
    recovery_max_age: float = 120.0
    recovery_max_count: int = 10_000
    recovery_max_replay: int = 1_000
    recovery_max_bytes: int = 33_554_432
    """Bytes of messages the recovery window holds (as they crossed the backplane)."""
    recovery_max_scan: int = 10_000
    """Entries of the window one recovery looks at, at most (more: ``too_many``)."""
    recovery_max_replays_per_minute: int = 120
    """Topic replays per connection, and per listener id on an instance, a minute (0: none)."""
    position_interval: float = 30.0
    api_prefix: str = "/_bow"
    api_max_batch: int = 1_000
    inbound_max_batch: int = 1_000
    idempotency_window: float = 600.0
    """Seconds an ``Idempotency-Key`` stays taken after its request was accepted."""
    """Messages one inbound request may return (a batch); more is ``413``."""
    count_max_ids: int = 10_000
    count_timeout: float = 0.5
    max_counts_per_second: float = 20.0
    history: tuple[HistoryRule, ...] = ()
    """Topics kept with a sequence, for replay (``[[history]]``)."""
    max_auth_failures_per_minute: int = 60
    """Failed Basic Auth attempts per client address a minute (bursts as many); then ``429``."""
    max_buffered_bytes_per_id: int = 4_194_304
    """Bytes waiting for the slow sockets of one listener id on an instance (0: no limit)."""
    max_anonymous: int = 10_000
    """Anonymous connections held on an instance (0: no limit); then 4009."""
    receipts_max_ids: int = 10_000
    """Ids a receipt lists (``receipts.max_ids``); past it a list is ``null``."""
    receipts_ttl: float = 3_600.0
    """Seconds a receipt is kept after its end (``receipts.ttl``)."""
    fallback_max_listeners: int = 1_000_000
    """Listeners of the audience index a fallback's ``message.undelivered`` lists at most
    (``fallback.max_listeners``); its events say how many more were left out."""
    webhooks: tuple[Webhook, ...] = ()
    """The ``[[webhooks]]`` receivers (section 19)."""
    offline_grace: float = 5.0
    """``presence.offline_grace``: seconds an id's last socket may be gone before it is offline."""
    webpush: WebPushSettings | None = None
    """The ``[webpush]`` connector's settings (section 20), or None: no connector."""

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.https is None or isinstance(self.https, ssl.SSLContext):
            return self.https
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(
            self.https["certfile"], self.https["keyfile"], self.https.get("password")
        )
        return context


def load_config(raw: Mapping[str, Any]) -> Config:
    """Check a configuration mapping; ``ValueError`` names every bad field."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"the configuration must be a mapping, not {type(raw).__name__}")
    raw = dict(raw)
    if raw.get("middleware") is None:
        raw.pop("middleware", None)
    # their defaults come from loading an empty table
    for section in ("recovery", "api", "presence", "receipts", "fallback", "webpush"):
        raw.setdefault(section, {})
    try:
        data = _ConfigSchema().load(raw)
    except ValidationError as error:
        raise ValueError("invalid configuration: " + error_text(error.messages)) from None
    history, webhooks, webpush = _tables(data)
    log_interval = data["middleware"].get("log_interval")
    return Config(
        port=data["port"],
        host=data["host"],
        https=data["https"],
        redis=data["redis"],
        namespace=data["namespace"],
        reuse_port=data["reuse_port"],
        gc_freeze=data["gc_freeze"],
        drain_timeout=data["drain_timeout"],
        backplane=data["backplane"],
        metrics_port=data["metrics"].get("port"),
        metrics_auth=data["metrics"].get("auth", False),
        log_interval=log_interval if log_interval and log_interval > 0 else None,
        realm=data["inbound"]["realm"],
        username=data["inbound"]["username"],
        password=data["inbound"]["password"],
        max_body_size=data["inbound"]["max_body_size"],
        inbound_timeout=data["inbound"]["timeout"],
        max_queries=data["inbound"]["max_queries"],
        max_predicates=data["inbound"]["max_predicates"],
        http_timeout=data["http_timeout"],
        auth_timeout=data["outbound"]["timeout"],
        max_buffered_bytes=data["outbound"]["max_buffered_bytes"],
        max_incoming_bytes=data["outbound"]["max_incoming_bytes"],
        max_sockets=data["outbound"]["max_sockets"],
        max_connects_per_second=data["outbound"]["max_connects_per_second"],
        transports=data["outbound"]["transports"],
        cors_origins=data["outbound"]["cors_origins"],
        expiry_grace=data["outbound"]["expiry_grace"],
        expire_v1_sockets=data["outbound"]["expire_v1_sockets"],
        max_event_bytes=data["outbound"]["max_event_bytes"],
        max_sockets_per_id=data["outbound"]["max_sockets_per_id"],
        max_authenticates_per_minute=data["outbound"]["max_authenticates_per_minute"],
        max_filters=data["outbound"]["max_filters"],
        max_filters_per_id=data["outbound"]["max_filters_per_id"],
        max_filters_per_instance=data["outbound"]["max_filters_per_instance"],
        max_publishes_per_second=data["outbound"]["max_publishes_per_second"],
        endpoint_paths={name: data["outbound"][f"{name}_path"] or None for name in declared()},
        recovery_enabled=data["recovery"]["enabled"],
        recovery_max_age=data["recovery"]["max_age"],
        recovery_max_count=data["recovery"]["max_count"],
        recovery_max_replay=data["recovery"]["max_replay"],
        recovery_max_bytes=data["recovery"]["max_bytes"],
        recovery_max_scan=data["recovery"]["max_scan"],
        recovery_max_replays_per_minute=data["recovery"]["max_replays_per_minute"],
        position_interval=data["recovery"]["position_interval"],
        api_prefix=data["api"]["prefix"],
        api_max_batch=data["api"]["max_batch"],
        inbound_max_batch=data["inbound"]["max_batch"],
        idempotency_window=data["inbound"]["idempotency_window"],
        count_max_ids=data["api"]["count_max_ids"],
        count_timeout=data["api"]["count_timeout"],
        max_counts_per_second=data["api"]["max_counts_per_second"],
        history=history,
        max_auth_failures_per_minute=data["inbound"]["max_auth_failures_per_minute"],
        max_buffered_bytes_per_id=data["outbound"]["max_buffered_bytes_per_id"],
        max_anonymous=data["outbound"]["max_anonymous"],
        receipts_max_ids=data["receipts"]["max_ids"],
        receipts_ttl=data["receipts"]["ttl"],
        fallback_max_listeners=data["fallback"]["max_listeners"],
        webhooks=webhooks,
        offline_grace=data["presence"]["offline_grace"],
        webpush=webpush,
    )


def _tables(
    data: Mapping[str, Any],
) -> tuple[tuple[HistoryRule, ...], tuple[Webhook, ...], WebPushSettings | None]:
    """The ``[[history]]``, ``[[webhooks]]`` and ``[webpush]`` tables, checked."""
    try:
        history = tuple(history_rules(data["history"]))
        return history, webhook_settings(data["webhooks"]), webpush_settings(data["webpush"])
    except ValueError as error:
        raise ValueError(f"invalid configuration: {error}") from None
