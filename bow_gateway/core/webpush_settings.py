"""The ``[webpush]`` settings (contract section 20's Web Push connector): :class:`WebPushSettings`,
checked by :func:`webpush_settings`. Here, beside ``[[webhooks]]``'s, so that the configuration
(a lower layer than :mod:`bow_gateway.connectors.webpush`) can hold them. The VAPID key is never
shown: not by ``repr``, not in an error."""

from __future__ import annotations

import base64
import binascii
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

KEY_BYTES: Final = 32
"""A raw P-256 private key's length: what ``vapid --gen`` (py_vapid) and web-push libraries
print base64url-encoded."""
_KEY_ERROR: Final = (
    "must be a P-256 (prime256v1) private key: PEM, or its 32 raw bytes base64url-encoded"
    " (the value is not shown)"
)


@dataclass(frozen=True)
class WebPushSettings:
    """The connector's settings: the VAPID key and subject, the pushes' ``TTL``, and its bounds.
    ``allow_http_loopback`` lets ``http://`` endpoints on the loopback in (tests only)."""

    private_key: ec.EllipticCurvePrivateKey = field(repr=False)
    subject: str
    ttl: int = 86_400
    max_subscriptions_per_listener: int = 10
    max_subscriptions: int = 1_000_000
    timeout: float = 10.0
    max_attempts: int = 8
    max_concurrency: int = 16
    allow_http_loopback: bool = False

    @property
    def public_key(self) -> str:
        """The application server key, base64url without padding: the ``k=`` of each request
        and the ``applicationServerKey`` a page subscribes with."""
        raw = self.private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def webpush_settings(
    table: Mapping[str, Any], environ: Mapping[str, str] = os.environ
) -> WebPushSettings | None:
    """The ``[webpush]`` table as marshmallow loaded it: ``None`` when it names no key and no
    subject (no connector); ``ValueError`` naming ``webpush.{setting}`` otherwise."""
    key_text, variable = table.get("vapid_private_key"), table.get("vapid_private_key_env")
    subject = table.get("subject")
    if not key_text and not variable and not subject:
        return None
    if key_text and variable:
        raise ValueError("webpush.vapid_private_key: give it or vapid_private_key_env, not both")
    if variable:
        key_text = environ.get(variable)
        if not key_text:
            raise ValueError(f"webpush.vapid_private_key_env: the variable {variable} is not set")
    if not key_text:
        raise ValueError("webpush.vapid_private_key: Missing data for required field.")
    if importlib.util.find_spec("http_ece") is None:
        raise ValueError("webpush: needs the webpush extra: pip install 'bow-gateway[webpush]'")
    where = "vapid_private_key_env" if variable else "vapid_private_key"
    private_key = vapid_private_key(key_text, where)
    check_subject(subject)
    numbers = {name: table[name] for name in _NUMBERS if table.get(name) is not None}
    return WebPushSettings(
        private_key=private_key,
        subject=str(subject),
        allow_http_loopback=bool(table.get("allow_http_loopback", False)),
        **numbers,
    )


_NUMBERS: Final = (
    "ttl",
    "max_subscriptions_per_listener",
    "max_subscriptions",
    "timeout",
    "max_attempts",
    "max_concurrency",
)


def vapid_private_key(text: str, where: str = "vapid_private_key") -> ec.EllipticCurvePrivateKey:
    """The P-256 key of ``text`` (PEM, or base64url of its 32 raw bytes or of its DER);
    ``ValueError`` naming ``webpush.{where}``, never quoting the value."""
    text = text.strip()
    try:
        if text.startswith("-----BEGIN"):
            key: Any = serialization.load_pem_private_key(text.encode(), password=None)
        else:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            if len(raw) == KEY_BYTES:
                key = ec.derive_private_key(int.from_bytes(raw, "big"), ec.SECP256R1())
            else:
                key = serialization.load_der_private_key(raw, password=None)
    except (ValueError, TypeError, binascii.Error, UnsupportedAlgorithm):
        raise ValueError(f"webpush.{where}: {_KEY_ERROR}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise ValueError(f"webpush.{where}: {_KEY_ERROR}")
    return key


def check_subject(subject: Any) -> None:
    """``ValueError`` unless ``subject`` is a ``mailto:`` address or an ``https:`` URL (RFC 8292
    section 2.1: how a push service reaches the sender)."""
    text = subject if isinstance(subject, str) else ""
    if text.startswith("mailto:") and "@" in text[7:]:
        return
    if text.startswith("https://") and urlsplit(text).hostname:
        return
    raise ValueError(
        "webpush.subject: must be a mailto: address (mailto:ops@example.com) or an https:// URL"
    )
