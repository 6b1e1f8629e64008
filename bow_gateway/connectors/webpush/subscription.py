"""A browser's push subscription (``PushSubscription.toJSON()``) as ``POST
/_bow/push-subscriptions`` takes it, checked: :func:`parsed_subscription`; a listener id as the
stores key it: :func:`listener_key`."""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import orjson
from cryptography.hazmat.primitives.asymmetric import ec

from ...core.criteria import ListenerId, is_listener_id
from ...core.message import dumps

MAX_ENDPOINT: Final = 2_048
"""Characters of an endpoint, at most."""
P256DH_BYTES: Final = 65
AUTH_BYTES: Final = 16
LOOPBACK: Final = frozenset({"127.0.0.1", "::1", "localhost"})
_BASE64URL: Final = re.compile(r"[A-Za-z0-9_-]+={0,2}")


@dataclass(frozen=True, slots=True)
class Subscription:
    """Where to push (``endpoint``) and the keys to encrypt for (base64url, as the browser gave
    them); ``at``: when it was stored (Unix seconds), the oldest dropped first."""

    endpoint: str
    p256dh: str
    auth: str
    at: float = 0.0

    def stored(self) -> bytes:
        """The stored form: ``{"endpoint", "keys": {"p256dh", "auth"}, "at"}``."""
        keys = {"p256dh": self.p256dh, "auth": self.auth}
        return dumps({"endpoint": self.endpoint, "keys": keys, "at": self.at})

    @classmethod
    def loaded(cls, data: bytes | str) -> Subscription:
        value = orjson.loads(data)
        keys = value["keys"]
        return cls(value["endpoint"], keys["p256dh"], keys["auth"], float(value.get("at", 0)))

    @property
    def origin(self) -> str:
        """The push service's origin: the VAPID token's audience, and what logs show."""
        parts = urlsplit(self.endpoint)
        return f"{parts.scheme}://{parts.netloc}"


def listener_key(listener_id: Any) -> str:
    """The JSON text of a listener id (42.0 is 42, as everywhere in the gateway); ``ValueError``
    for a value that is not one."""
    if not is_listener_id(listener_id):
        raise ValueError("id: must be a listener id, a number or a non-empty string")
    if isinstance(listener_id, float) and listener_id.is_integer():
        listener_id = int(listener_id)
    return dumps(listener_id).decode()


def listener_of(key: str) -> ListenerId:
    """The listener id of its key."""
    value: ListenerId = orjson.loads(key)
    return value


def check_endpoint(endpoint: Any, allow_http_loopback: bool = False) -> str:
    """``endpoint`` if it is an https URL with a host (or, allowed, http on the loopback)."""
    if not isinstance(endpoint, str) or not endpoint:
        raise ValueError("subscription.endpoint: must be a non-empty string, an https:// URL")
    if len(endpoint) > MAX_ENDPOINT:
        raise ValueError(f"subscription.endpoint: at most {MAX_ENDPOINT} characters")
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname
        parts.port  # noqa: B018 - raises for a bad port
    except ValueError:
        raise ValueError("subscription.endpoint: not a URL") from None
    loopback_http = allow_http_loopback and parts.scheme == "http" and host in LOOPBACK
    spaced = any(c.isspace() for c in endpoint)
    if not host or not (parts.scheme == "https" or loopback_http) or spaced:
        raise ValueError("subscription.endpoint: must be an https:// URL with a host")
    return endpoint


def parsed_subscription(value: Any, allow_http_loopback: bool = False) -> Subscription:
    """The subscription of ``value`` (``{"endpoint", "keys": {"p256dh", "auth"}}``, and an
    ``expirationTime`` ignored); ``ValueError`` naming what is wrong."""
    if not isinstance(value, Mapping):
        raise ValueError('subscription: must be {"endpoint", "keys": {"p256dh", "auth"}}')
    unknown = sorted(str(key) for key in set(value) - {"endpoint", "keys", "expirationTime"})
    if unknown:
        raise ValueError(f"subscription: unknown key {unknown[0][:60]!r}")
    endpoint = check_endpoint(value.get("endpoint"), allow_http_loopback)
    keys = value.get("keys")
    if not isinstance(keys, Mapping) or set(keys) != {"p256dh", "auth"}:
        raise ValueError('subscription.keys: must be {"p256dh": ..., "auth": ...}')
    p256dh = _decoded(keys["p256dh"], "p256dh", P256DH_BYTES)
    try:
        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), p256dh)
    except ValueError:
        raise ValueError(
            "subscription.keys.p256dh: not an uncompressed P-256 public key (65 bytes, 0x04 first)"
        ) from None
    _decoded(keys["auth"], "auth", AUTH_BYTES)
    return Subscription(endpoint, keys["p256dh"].rstrip("="), keys["auth"].rstrip("="), time.time())


def decoded_key(text: str) -> bytes:
    """The bytes of a base64url text, padded or not."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _decoded(text: Any, name: str, size: int) -> bytes:
    where = f"subscription.keys.{name}"
    if not isinstance(text, str) or not _BASE64URL.fullmatch(text):
        raise ValueError(f"{where}: must be base64url (A-Z, a-z, 0-9, - and _)")
    try:
        raw = decoded_key(text.rstrip("="))
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: must be base64url (A-Z, a-z, 0-9, - and _)") from None
    if len(raw) != size:
        raise ValueError(f"{where}: must decode to {size} bytes, not {len(raw)}")
    return raw
