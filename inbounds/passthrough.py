"""The inbound of Bow's examples: ``name`` and ``audience`` from the body, which is the payload.

A JSON list of such bodies is a batch (``bow-gateway push --batch``): a list of messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def create_message_from_request_body(body: Any) -> dict[str, Any] | list[dict[str, Any]]:
    """``{"name", "audience", ...}`` becomes a message whose payload is the whole body; a list
    of them, a list of messages."""
    if isinstance(body, list):
        return [_passed_through(item, f"{index}: ") for index, item in enumerate(body)]
    return _passed_through(body)


def create_message_from_envelope(body: Any) -> dict[str, Any] | list[dict[str, Any]]:
    """``{"name", "payload"?, "audience"}`` becomes exactly that message (no extra fields sent);
    a list of them, a list of messages."""
    if isinstance(body, list):
        return [_envelope(item, f"{index}: ") for index, item in enumerate(body)]
    return _envelope(body)


def _passed_through(body: Any, where: str = "") -> dict[str, Any]:
    _check_object(body, where)
    for field in ("name", "audience"):
        if field not in body:
            raise ValueError(f"{where}the body has no {field!r}")
    return {"name": body["name"], "payload": dict(body), "audience": body["audience"]}


def _envelope(body: Any, where: str = "") -> dict[str, Any]:
    _check_object(body, where)
    return dict(body)


def _check_object(body: Any, where: str) -> None:
    if not isinstance(body, Mapping):
        what = "an item of the list" if where else "the body"
        raise ValueError(f"{where}{what} must be a JSON object, not {type(body).__name__}")
