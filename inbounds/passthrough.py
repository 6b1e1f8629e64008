"""The inbound of Bow's examples: ``name`` and ``audience`` from the body, which is the payload."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def create_message_from_request_body(body: Any) -> dict[str, Any]:
    """``{"name", "audience", ...}`` becomes a message whose payload is the whole body."""
    if not isinstance(body, Mapping):
        raise ValueError(f"the body must be a JSON object, not {type(body).__name__}")
    for field in ("name", "audience"):
        if field not in body:
            raise ValueError(f"the body has no {field!r}")
    return {"name": body["name"], "payload": dict(body), "audience": body["audience"]}


def create_message_from_envelope(body: Any) -> dict[str, Any]:
    """``{"name", "payload"?, "audience"}`` becomes exactly that message (no extra fields sent)."""
    if not isinstance(body, Mapping):
        raise ValueError(f"the body must be a JSON object, not {type(body).__name__}")
    return dict(body)
