"""A gateway with the Flywheel outbound, and what its tests send it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bow_gateway.inbounds.passthrough import create_message_from_envelope
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound

from bow_gateway import Bow

from . import PATH, SECRET, base_config, token

QUOTES = [{"desk": "fx"}]


def publish_to_desk(details: Mapping[str, Any] | None, topic: str, body: str) -> dict[str, Any]:
    """A publish hook: the body to everyone of the publisher's desk (refused when anonymous or
    when the topic is not a quote)."""
    if details is None:
        raise PermissionError("anonymous listeners do not publish")
    if not topic.startswith("quotes/"):
        raise PermissionError(f"no publishing on {topic}")
    return {"name": topic, "payload": body, "audience": [{"desk": "fx"}]}


def flywheel_bow(
    config: dict[str, Any] | None = None,
    *,
    anonymous: dict[str, Any] | None = None,
    publish: Any = publish_to_desk,
) -> Bow:
    return (
        Bow(config or base_config())
        .middleware(version="v1", create_criteria_from_listener_details=criteria_from_claim())
        .inbound(
            path=PATH,
            create_message_from_request_body=create_message_from_envelope,
            middleware_version="v1",
        )
        .outbound(
            version="v1",
            create_listener_details_from_token=JwtOutbound(secret=SECRET),
            middleware_version="v1",
            anonymous_criteria=anonymous,
            create_message_from_publish=publish,
        )
    )


def bearer(listener_id: str, criteria: dict[str, Any] | None = None, **kw: Any) -> dict[str, str]:
    return {"type": "Bearer", "token": token(listener_id, criteria or {}, **kw)}
