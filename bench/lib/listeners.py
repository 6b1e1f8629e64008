"""The benchmark listeners: listener ``i``'s id, criteria and JWT, the same in every benchmark."""

from __future__ import annotations

from typing import Any

from bow_gateway.outbounds import jwt

from lib import gateway


def listener_id(i: int) -> str:
    return f"bench-{i}"


def criteria(i: int) -> dict[str, Any]:
    return {"all": True, "g10": i % 10 == 0, "role": ("admin", "author", "subscriber")[i % 3]}


def mint(listener: str, secret: str, criteria: dict[str, Any]) -> str:
    """A JWT of ``listener`` with ``criteria``, signed with ``secret`` (the bundled JWT
    outbound's ``mint``)."""
    token: str = jwt.mint(listener, secret, criteria=criteria)
    return token


def token(i: int) -> str:
    """Listener ``i``'s JWT for the gateway of ``lib/gateway.py``."""
    return mint(listener_id(i), gateway.SECRET, criteria(i))
