"""A gateway with the Gobbler WebSocket outbound and a ``[[history]]`` rule, whose publishes go
to rooms."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bow_gateway.inbounds.gobbler import GobblerInbound
from bow_gateway.inbounds.passthrough import create_message_from_envelope
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound

from bow_gateway import Bow

from . import PATH, SECRET, base_config

MEMBERS = [{"room": 1}]


def publish_to_room(details: Mapping[str, Any] | None, topic: str, body: str) -> dict[str, Any]:
    if topic.startswith("/closed/"):
        raise PermissionError(f"{topic} is closed")
    return {"name": topic, "payload": body, "audience": MEMBERS}


def gobbler_bow(**config: Any) -> Bow:
    config.setdefault("history", [{"filter": "/chat/#", "max_count": 1000}])
    return (
        Bow(base_config(**config))
        .middleware(version="v1", create_criteria_from_listener_details=criteria_from_claim())
        .inbound(
            path=PATH,
            create_message_from_request_body=create_message_from_envelope,
            middleware_version="v1",
        )
        .inbound(
            path="/api/message/{topic:.+}",
            create_message_from_request=GobblerInbound(audience=MEMBERS),
            middleware_version="v1",
        )
        .outbound(
            version="v1",
            create_listener_details_from_token=JwtOutbound(secret=SECRET),
            middleware_version="v1",
            create_message_from_publish=publish_to_room,
        )
    )
