"""Criteria carried by the token itself (Bow's "complex JWT" example).

Use with the JWT outbound: its listener details hold the token's ``claims``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bow_gateway.core.plugins import CreateCriteriaFromListenerDetails


def criteria_from_claim(claim: str = "criteria") -> CreateCriteriaFromListenerDetails:
    """Criteria read from ``details["claims"][claim]`` (a token without it has no criteria)."""

    def create_criteria_from_listener_details(details: Mapping[str, Any]) -> Any:
        claims = details.get("claims", details)
        return claims.get(claim, {})

    create_criteria_from_listener_details.__qualname__ = f"criteria_from_claim({claim!r})"
    return create_criteria_from_listener_details


create_criteria_from_listener_details = criteria_from_claim()
