"""The ``[[webhooks]]`` settings (contract section 19): :class:`Webhook`, checked by
:func:`webhook_settings`. Here, beside ``[[history]]``'s rules, so that the configuration (a lower
layer than the delivery engine, :mod:`bow_gateway.webhooks`) can hold them."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

EVENT_TYPES: Final = (
    "listener.online",
    "listener.offline",
    "message.receipt",
    "message.undelivered",
)
"""The event types a webhook may take."""
SECRET_PREFIX: Final = "whsec_"
MIN_SECRET_BYTES: Final = 24
_KEYS: Final = {"url", "secret", "events", "timeout", "max_attempts", "max_concurrency"}


@dataclass(frozen=True)
class Webhook:
    """One receiver: where, signed with what, for which event types, how patiently. The secret
    is never shown by ``repr``."""

    url: str
    secret: str = field(repr=False)
    events: frozenset[str]
    timeout: float = 5.0
    max_attempts: int = 8
    max_concurrency: int = 16

    def __post_init__(self) -> None:
        check_webhook(self, "webhook")

    @cached_property  # computed once, not per request (a frozen dataclass keeps a __dict__)
    def key(self) -> bytes:
        """The HMAC key: the secret's base64 decoded, its ``whsec_`` prefix left out."""
        return base64.b64decode(self.secret.removeprefix(SECRET_PREFIX))

    @cached_property
    def tag(self) -> str:
        """A short name of the URL, stable across restarts and reorderings of the tables: the end
        of each ``webhook-id`` sent to it."""
        return hashlib.blake2b(self.url.encode(), digest_size=4).hexdigest()

    @property
    def shown_url(self) -> str:
        """The URL without its userinfo (a password), for logs and dead letters."""
        return redacted_url(self.url)


def redacted_url(url: str) -> str:
    """``url`` without ``user:password@``."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def check_webhook(webhook: Webhook, where: str) -> None:
    """``ValueError`` naming ``where`` and the field at fault; the secret is never quoted."""
    parts = urlsplit(webhook.url) if isinstance(webhook.url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{where}.url: must be an http:// or https:// URL with a host")
    if not _good_secret(webhook.secret):
        raise ValueError(
            f'{where}.secret: must be "{SECRET_PREFIX}" then the base64 of at least '
            f"{MIN_SECRET_BYTES} random bytes (the value is not shown)"
        )
    events = webhook.events
    if not events or not isinstance(events, frozenset) or not events <= set(EVENT_TYPES):
        raise ValueError(f"{where}.events: a non-empty list of {', '.join(EVENT_TYPES)}")
    if not _number(webhook.timeout) or not 0 < webhook.timeout <= 300:
        raise ValueError(f"{where}.timeout: seconds, more than 0 and at most 300")
    for name, most in (("max_attempts", 100), ("max_concurrency", 1_000)):
        value = getattr(webhook, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ValueError(f"{where}.{name}: an integer from 1 to {most}")


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _good_secret(secret: Any) -> bool:
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        return False
    try:
        decoded = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        return False
    return len(decoded) >= MIN_SECRET_BYTES


def webhook_settings(tables: Any) -> tuple[Webhook, ...]:
    """The ``webhooks`` setting (a list of tables, or ``BOW_WEBHOOKS``'s JSON text):
    ``ValueError`` names the bad table and field, ``webhooks.0.secret`` say."""
    if tables is None:
        return ()
    if isinstance(tables, str):  # BOW_WEBHOOKS: the list as JSON
        try:
            tables = json.loads(tables)
        except ValueError:
            raise ValueError("webhooks: not a JSON list of tables") from None
    if not isinstance(tables, Sequence) or isinstance(tables, (str, bytes)):
        raise ValueError("webhooks: must be a list of tables ([[webhooks]])")
    found: list[Webhook] = []
    for index, table in enumerate(tables):
        where = f"webhooks.{index}"
        if not isinstance(table, Mapping):
            raise ValueError(f"{where}: a table with url, secret, events")
        unknown = sorted(str(key) for key in set(table) - _KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0][:60]!r}")
        for key in ("url", "secret", "events"):
            if key not in table:
                raise ValueError(f"{where}.{key}: Missing data for required field.")
        events = table["events"]
        if not isinstance(events, Sequence) or isinstance(events, (str, bytes)):
            raise ValueError(f"{where}.events: a non-empty list of {', '.join(EVENT_TYPES)}")
        values = {key: table[key] for key in _KEYS if key in table}
        events = values["events"]
        values["events"] = frozenset(events) if all(isinstance(e, str) for e in events) else None
        try:
            webhook = Webhook(**values)
        except ValueError as error:  # named "webhook.{field}": named here by its table
            raise ValueError(str(error).replace("webhook.", f"{where}.", 1)) from None
        if any(other.url == webhook.url for other in found):
            raise ValueError(f"{where}.url: another table has the same url")
        found.append(webhook)
    return tuple(found)
