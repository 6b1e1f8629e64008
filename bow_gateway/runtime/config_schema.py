"""The gateway's configuration as marshmallow checks it: each table's schema, and the fields
that need more than marshmallow's (Redis settings, HTTPS, CORS origins, paths)."""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate

from .protocol_paths import declared
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
    idempotency_window = fields.Float(
        load_default=600.0,
        validate=validate.Range(
            min=1, max=86_400, error="must be from {min} to {max} seconds (a day)"
        ),
    )


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


def _outbound_schema() -> Schema:
    """The ``[outbound]`` table: :class:`_OutboundSchema`, and each client protocol's
    ``{name}_path`` (:mod:`.protocol_paths`)."""
    paths: dict[str, fields.Field] = {  # type: ignore[type-arg]
        f"{name}_path": fields.String(
            load_default=default, allow_none=True, validate=_check_endpoint_path
        )
        for name, default in declared().items()
    }
    return _OutboundSchema.from_dict(paths, name="OutboundSchema")()


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


class _PresenceSchema(Schema):
    offline_grace = fields.Float(
        load_default=5.0,
        validate=validate.Range(
            min=0, min_inclusive=False, max=3600, error="must be more than 0 and at most 3600"
        ),
    )


class _ReceiptsSchema(Schema):
    max_ids = fields.Integer(load_default=10_000, validate=validate.Range(min=0))
    ttl = fields.Float(
        load_default=3_600.0,
        validate=validate.Range(min=0, min_inclusive=False, error="must be positive"),
    )


class _FallbackSchema(Schema):
    max_listeners = fields.Integer(
        load_default=1_000_000, validate=validate.Range(min=1, max=100_000_000)
    )


class _WebPushSchema(Schema):
    """``[webpush]`` (section 20): types and ranges here; the key and the subject are checked by
    :func:`bow_gateway.core.webpush_settings.webpush_settings`."""

    vapid_private_key = fields.String(load_default=None, allow_none=True)
    vapid_private_key_env = fields.String(load_default=None, allow_none=True)
    subject = fields.String(load_default=None, allow_none=True)
    ttl = fields.Integer(
        load_default=86_400,
        validate=validate.Range(min=0, max=2_419_200, error="must be from {min} to {max} seconds"),
    )
    max_subscriptions_per_listener = fields.Integer(
        load_default=10, validate=validate.Range(min=1, max=1_000)
    )
    max_subscriptions = fields.Integer(load_default=1_000_000, validate=validate.Range(min=1))
    timeout = fields.Float(
        load_default=10.0,
        validate=validate.Range(min=0, min_inclusive=False, max=300, error="must be in (0, 300]"),
    )
    max_attempts = fields.Integer(load_default=8, validate=validate.Range(min=1, max=100))
    max_concurrency = fields.Integer(load_default=16, validate=validate.Range(min=1, max=1_000))
    allow_http_loopback = fields.Boolean(load_default=False)


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
    outbound = fields.Nested(_outbound_schema, required=True)
    recovery = fields.Nested(_RecoverySchema, load_default=dict)
    api = fields.Nested(_ApiSchema, load_default=dict)
    history = fields.Raw(load_default=list)
    presence = fields.Nested(_PresenceSchema, load_default=dict)
    receipts = fields.Nested(_ReceiptsSchema, load_default=dict)
    fallback = fields.Nested(_FallbackSchema, load_default=dict)
    webhooks = fields.Raw(load_default=list)  # checked by core.webhook_settings
    webpush = fields.Nested(_WebPushSchema, load_default=dict)  # and core.webpush_settings
