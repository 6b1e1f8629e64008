"""bow_gateway: a real-time push gateway. HTTP inbounds in, Socket.IO outbounds out.

Backends POST messages that carry an audience; sockets authenticate with a token; each message
reaches exactly the sockets whose criteria match its audience.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app.server import Bow
    from .core.codes import TokenExpired
    from .core.plugins import (
        AsyncClosable,
        CreateCriteriaFromListenerDetails,
        CreateListenerDetailsFromToken,
        CreateMessageFromPublish,
        CreateMessageFromRequest,
        CreateMessageFromRequestBody,
        Enrich,
        HealthCheck,
        InboundRequest,
        WatchesCriteria,
    )

__all__ = [
    "AsyncClosable",
    "Bow",
    "CreateCriteriaFromListenerDetails",
    "CreateListenerDetailsFromToken",
    "CreateMessageFromPublish",
    "CreateMessageFromRequest",
    "CreateMessageFromRequestBody",
    "Enrich",
    "HealthCheck",
    "InboundRequest",
    "TokenExpired",
    "WatchesCriteria",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """The public names, imported at their first use (PEP 562): the command line's clients and
    the criteria job start without the gateway's server modules."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = {"Bow": ".app.server", "TokenExpired": ".core.codes"}.get(name, ".core.plugins")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
