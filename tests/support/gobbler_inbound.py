"""A gateway with the bundled Gobbler REST inbound (``POST /api/message/{topic}``) and a
protocol-2 outbound."""

from __future__ import annotations

from typing import Any

from bow_gateway.inbounds.gobbler import GobblerInbound
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound

from bow_gateway import Bow

from . import SECRET, base_config

ROUTE = "/api/message/{topic:.+}"
AUDIENCE = [{"role": "admin"}]


def gobbler_bow(path: str = ROUTE, **config: Any) -> Bow:
    return (
        Bow(base_config(**config))
        .middleware(version="v1", create_criteria_from_listener_details=criteria_from_claim())
        .inbound(
            path=path,
            create_message_from_request=GobblerInbound(audience=AUDIENCE),
            middleware_version="v1",
        )
        .outbound(
            version="v1.3",
            create_listener_details_from_token=JwtOutbound(secret=SECRET),
            middleware_version="v1",
        )
    )
