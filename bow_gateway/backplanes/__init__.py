"""Backplanes: how events reach every instance of one gateway, all in one order.

:mod:`.base` is the interface, :mod:`.memory` keeps everything in this process, :mod:`.redis`
carries events on a Redis Stream; :func:`backplane_from_config` picks one from the ``redis``
setting, the way encode's broadcaster picks one by URL scheme.
"""

from __future__ import annotations

from typing import Any

from ..core.retention import Retention
from .base import (
    AlreadyAccepted,
    Backplane,
    BackplaneUnavailable,
    Claim,
    Entry,
    Gap,
    Report,
    Stored,
)
from .memory import MemoryBackplane

__all__ = [
    "AlreadyAccepted",
    "Backplane",
    "BackplaneUnavailable",
    "Claim",
    "Entry",
    "Gap",
    "MemoryBackplane",
    "Report",
    "Retention",
    "Stored",
    "backplane_from_config",
]


def backplane_from_config(
    redis: Any,
    *,
    namespace: str = "bow",
    max_pending: int = 10_000,
    max_len: int = 100_000,
    connect_retries: int = 5,
    publish_timeout: float = 2.0,
) -> Backplane:
    """The backend for the ``redis`` setting: in-process for ``None``, a Redis stream otherwise."""
    if redis is None:
        return MemoryBackplane(max_pending=max_pending)
    from .redis import RedisBackplane  # redis-py is imported only by a gateway that uses it

    return RedisBackplane(
        redis,
        namespace=namespace,
        max_len=max_len,
        connect_retries=connect_retries,
        publish_timeout=publish_timeout,
    )
