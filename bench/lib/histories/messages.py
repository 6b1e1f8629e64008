"""The messages of ``history_bench.py``: envelopes of ``chat/...`` topics, alone or in batches."""

from __future__ import annotations

import json
import time
from typing import Any

PAYLOAD = 100  # characters (bytes: ASCII) per payload
AUDIENCE = [{"room": 1}]
NOBODY = [{"room": 2}]  # the memory part: no delivery
LIVE, REPLAYED, MEMORY = "chat/room1", "chat/replay", "chat/memory"
monotonic_ns = time.monotonic_ns


def envelope(name: str, t: int, audience: list[dict[str, Any]] = AUDIENCE) -> bytes:
    """One message: its payload is ``t`` (19 digits) padded to 100 characters."""
    payload = f"{t:019d}".ljust(PAYLOAD, "x")
    return json.dumps(
        {"name": name, "payload": payload, "audience": audience}, separators=(",", ":")
    ).encode()


def batch_body(name: str, count: int, audience: list[dict[str, Any]] = AUDIENCE) -> bytes:
    """A JSON list of ``count`` messages, all stamped now."""
    one = envelope(name, monotonic_ns(), audience)
    return b"[" + b",".join([one] * count) + b"]"
