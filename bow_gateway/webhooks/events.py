"""What a webhook carries: :class:`WebhookEvent`, its stored form (one JSON text, the same in
memory and in Redis) and the body sent, ``{"type", "timestamp", "data"}``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from ..core.message import dumps
from ..core.webhook_settings import EVENT_TYPES


@dataclass(frozen=True, slots=True)
class WebhookEvent:
    """An event for the webhooks that take ``type``. ``key``: events with the same non-empty key
    reach each webhook in the order they were stored, one at a time (an id's online and offline
    use the id's JSON text); ``at``: when it happened (Unix seconds)."""

    type: str
    data: Mapping[str, Any]
    key: str = ""
    at: float = field(default_factory=time.time)

    def stored(self) -> bytes:
        """The stored form: ``{"type", "data", "key", "at"}``, compact JSON."""
        return dumps({"type": self.type, "data": self.data, "key": self.key, "at": self.at})

    def body(self) -> bytes:
        """The request's body: ``{"type", "timestamp" (ISO 8601, UTC), "data"}``."""
        stamp = datetime.fromtimestamp(self.at, UTC).isoformat(timespec="milliseconds")
        return dumps(
            {"type": self.type, "timestamp": stamp.replace("+00:00", "Z"), "data": self.data}
        )


def check_event(event: WebhookEvent) -> None:
    """``ValueError`` for an event no webhook can take."""
    if event.type not in EVENT_TYPES:
        raise ValueError(f"{event.type!r} is not a webhook event type")
    if not isinstance(event.key, str) or not isinstance(event.data, Mapping):
        raise ValueError("a webhook event's key is a string and its data a mapping")


def loaded(data: bytes) -> WebhookEvent:
    """The event of its stored form; ``ValueError`` if it is not one."""
    try:
        value = orjson.loads(data)
        return WebhookEvent(
            value["type"], value["data"], value.get("key") or "", float(value["at"])
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"not a stored webhook event: {error}") from None
