"""The gateway's configuration (section 1 of the contract), checked with marshmallow."""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate

from ..core.criteria import error_text
from ..core.retention import HistoryRule, history_rules
from .redis_client import check_settings, redacted

NON_EMPTY = validate.Length(min=1, error="must not be empty")


class _RedisField(fields.Field):  # type: ignore[type-arg]
    """``None``, or what :func:`bow_gateway.runtime.redis_client.redis_client` takes: a URL, a dict
    of redis-py connection kwargs (Sentinel's too), or a list of dicts (cluster nodes)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if value is None:
            return value
        try:
            settings = check_settings(value)
            if isinstance(settings, str):
                from redis.connection import parse_url  # here: only a URL needs redis-py

                parse_url(settings)  # type: ignore[no-untyped-call]  # as the client reads it
        except ValueError as error:
            if isinstance(value, str):  # named, without its password
                raise ValidationError(f"{redacted(value)!r} is not a Redis URL: {error}") from None
            raise ValidationError(str(error)) from None
        return settings


class _HttpsField(fields.Field):  # type: ignore[type-arg]
    """``None``, an ``ssl.SSLContext``, or ``{"certfile", "keyfile", "password"?}``."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if value is None or isinstance(value, ssl.SSLContext):
            return value
        if isinstance(value, Mapping):
            errors = _HttpsSchema().validate(dict(value))
            if errors:
                raise ValidationError(errors)
            return dict(value)
        raise ValidationError("must be an ssl.SSLContext or a mapping with certfile and keyfile")


_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#\s]+")


class _OriginsField(fields.Field):  # type: ignore[type-arg]
    """``"*"`` or a list of origins (``"https://app.example.com"``), loaded as a list."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if value == "*":
            return ["*"]
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ValidationError('must be "*" or a list of origins like "https://app.example.com"')
        origins = [item.strip().lower() for item in value]  # browsers send them in lower case
        if "*" in origins and len(origins) > 1:
            raise ValidationError('"*" allows every origin: give it alone')
        for origin in origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValidationError(
                    f"{origin!r} is not an origin: scheme://host[:port], without a path"
                )
        return origins


class _HttpsSchema(Schema):
    certfile = fields.String(required=True, validate=NON_EMPTY)
    keyfile = fields.String(required=True, validate=NON_EMPTY)
    password = fields.String(load_default=None, allow_none=True)


class _MiddlewareSchema(Schema):
    log_interval = fields.Float(load_default=None, allow_none=True)


class _InboundSchema(Schema):
    realm = fields.String(required=True, validate=NON_EMPTY)
    username = fields.String(required=True, validate=NON_EMPTY)
    password = fields.String(required=True, validate=NON_EMPTY)
    max_body_size = fields.Integer(
        load_default=1_048_576, validate=validate.Range(min=1, error="must be at least 1 byte")
    )
    timeout = fields.Float(
        load_default=5.0,
        validate=validate.Range(min=0, min_inclusive=False, error="must be positive"),
    )
    max_queries = fields.Integer(load_default=1_000, validate=validate.Range(min=1))
    max_predicates = fields.Integer(load_default=32, validate=validate.Range(min=1))
    max_batch = fields.Integer(load_default=1_000, validate=validate.Range(min=1))
    max_auth_failures_per_minute = fields.Integer(load_default=60, validate=validate.Range(min=1))


_PREFIX = re.compile(r"(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)+")


def _check_prefix(prefix: str) -> None:
    if prefix == "/" or not _PREFIX.fullmatch(prefix):
        raise ValidationError(
            "must be a path like /_bow: starting with '/', not '/' alone, without an empty "
            "segment, a trailing '/', a query or spaces"
        )
    if prefix == "/socket.io" or prefix.startswith("/socket.io/"):
        raise ValidationError("must not be under /socket.io/, which needs no credentials")


def _check_endpoint_path(path: str) -> None:
    """An outbound endpoint's path; "" (an empty ``BOW_OUTBOUND_SSE_PATH``, or in a TOML file)
    turns it off, as None."""
    if path:
        _check_prefix(path)


class _OutboundSchema(Schema):
    timeout = fields.Float(
        required=True, validate=validate.Range(min=0, min_inclusive=False, error="must be positive")
    )
    max_buffered_bytes = fields.Integer(load_default=1_048_576, validate=validate.Range(min=1))
    max_incoming_bytes = fields.Integer(load_default=16_384, validate=validate.Range(min=1))
    max_sockets = fields.Integer(load_default=20_000, validate=validate.Range(min=1))
    max_connects_per_second = fields.Float(
        load_default=500.0,
        validate=validate.Range(min=0, min_inclusive=False, error="must be positive"),
    )
    transports = fields.List(
        fields.String(validate=validate.OneOf(["polling", "websocket"])),
        load_default=lambda: ["polling", "websocket"],
        validate=validate.Length(min=1, error="must name at least one transport"),
    )
    cors_origins = _OriginsField(load_default=list)
    expiry_grace = fields.Float(load_default=25.0, validate=validate.Range(min=0))
    expire_v1_sockets = fields.Boolean(load_default=False)
    max_event_bytes = fields.Integer(
        load_default=262_144, validate=validate.Range(min=64, error="must be at least {min} bytes")
    )
    max_sockets_per_id = fields.Integer(
        load_default=100, validate=validate.Range(min=0, error="must be 0 (no limit) or more")
    )
    max_buffered_bytes_per_id = fields.Integer(
        load_default=4_194_304, validate=validate.Range(min=0, error="must be 0 (no limit) or more")
    )
    max_anonymous = fields.Integer(
        load_default=10_000, validate=validate.Range(min=0, error="must be 0 (no limit) or more")
    )
    max_authenticates_per_minute = fields.Integer(load_default=12, validate=validate.Range(min=1))
    max_filters = fields.Integer(load_default=100, validate=validate.Range(min=1))
    max_filters_per_id = fields.Integer(load_default=1_000, validate=validate.Range(min=1))
    max_filters_per_instance = fields.Integer(load_default=200_000, validate=validate.Range(min=1))
    max_publishes_per_second = fields.Integer(load_default=100, validate=validate.Range(min=1))
    sse_path = fields.String(load_default="/events", allow_none=True, validate=_check_endpoint_path)
    flywheel_path = fields.String(
        load_default="/broker", allow_none=True, validate=_check_endpoint_path
    )
    gobbler_path = fields.String(
        load_default="/gobbler", allow_none=True, validate=_check_endpoint_path
    )


class _RecoverySchema(Schema):
    enabled = fields.Boolean(load_default=True)
    max_age = fields.Float(
        load_default=120.0,
        validate=validate.Range(min=0, min_inclusive=False, error="must be positive"),
    )
    max_count = fields.Integer(load_default=10_000, validate=validate.Range(min=1))
    max_replay = fields.Integer(load_default=1_000, validate=validate.Range(min=1))
    max_bytes = fields.Integer(
        load_default=33_554_432, validate=validate.Range(min=1, error="must be at least 1 byte")
    )
    max_scan = fields.Integer(load_default=10_000, validate=validate.Range(min=1))
    max_replays_per_minute = fields.Integer(
        load_default=120, validate=validate.Range(min=0, error="must be 0 (no limit) or more")
    )
    position_interval = fields.Float(
        load_default=30.0,
        validate=validate.Range(min=0, min_inclusive=False, error="must be positive"),
    )


class _ApiSchema(Schema):
    prefix = fields.String(load_default="/_bow", validate=_check_prefix)
    max_batch = fields.Integer(load_default=1_000, validate=validate.Range(min=1))
    count_max_ids = fields.Integer(load_default=10_000, validate=validate.Range(min=0))
    count_timeout = fields.Float(
        load_default=0.5,
        validate=validate.Range(min=0, min_inclusive=False, max=60, error="must be in (0, 60]"),
    )
    max_counts_per_second = fields.Float(
        load_default=20.0,
        validate=validate.Range(min=0, min_inclusive=False, error="must be positive"),
    )


class _MetricsSchema(Schema):
    port = fields.Integer(
        load_default=None, allow_none=True, validate=validate.Range(min=0, max=65535)
    )
    auth = fields.Boolean(load_default=False)


class _BackplaneSchema(Schema):
    max_pending = fields.Integer(load_default=10_000, validate=validate.Range(min=1))
    max_len = fields.Integer(load_default=100_000, validate=validate.Range(min=1))
    connect_retries = fields.Integer(load_default=5, validate=validate.Range(min=0))
    publish_timeout = fields.Float(
        load_default=2.0,
        validate=validate.Range(min=0, min_inclusive=False, error="must be positive"),
    )


class _ConfigSchema(Schema):
    port = fields.Integer(required=True, validate=validate.Range(min=0, max=65535))
    host = fields.String(load_default="0.0.0.0", validate=NON_EMPTY)
    https = _HttpsField(load_default=None, allow_none=True)
    redis = _RedisField(load_default=None, allow_none=True)
    namespace = fields.String(load_default="bow", validate=NON_EMPTY)
    reuse_port = fields.Boolean(load_default=False)
    gc_freeze = fields.Boolean(load_default=False)
    drain_timeout = fields.Float(
        load_default=10.0,
        validate=validate.Range(min=0, min_inclusive=False, error="must be positive"),
    )
    http_timeout = fields.Float(
        load_default=10.0,
        validate=validate.Range(min=0, min_inclusive=False, error="must be positive"),
    )
    backplane = fields.Nested(_BackplaneSchema, load_default=dict)
    metrics = fields.Nested(_MetricsSchema, load_default=dict)
    middleware = fields.Nested(_MiddlewareSchema, load_default=dict)
    inbound = fields.Nested(_InboundSchema, required=True)
    outbound = fields.Nested(_OutboundSchema, required=True)
    recovery = fields.Nested(_RecoverySchema, load_default=dict)
    api = fields.Nested(_ApiSchema, load_default=dict)
    history = fields.Raw(load_default=list)


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
    sse_path: str | None = "/events"
    flywheel_path: str | None = "/broker"
    gobbler_path: str | None = "/gobbler"
    """The Server-Sent Events endpoint (``GET``); None (or ``""``): none."""
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
    for section in ("recovery", "api"):  # their defaults come from loading an empty table
        raw.setdefault(section, {})
    try:
        data = _ConfigSchema().load(raw)
    except ValidationError as error:
        raise ValueError("invalid configuration: " + error_text(error.messages)) from None
    try:
        history = tuple(history_rules(data["history"]))
    except ValueError as error:
        raise ValueError(f"invalid configuration: {error}") from None
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
        sse_path=data["outbound"]["sse_path"] or None,
        flywheel_path=data["outbound"]["flywheel_path"] or None,
        gobbler_path=data["outbound"]["gobbler_path"] or None,
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
        count_max_ids=data["api"]["count_max_ids"],
        count_timeout=data["api"]["count_timeout"],
        max_counts_per_second=data["api"]["max_counts_per_second"],
        history=history,
        max_auth_failures_per_minute=data["inbound"]["max_auth_failures_per_minute"],
        max_buffered_bytes_per_id=data["outbound"]["max_buffered_bytes_per_id"],
        max_anonymous=data["outbound"]["max_anonymous"],
    )
