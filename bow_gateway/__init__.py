"""bow_gateway: a real-time push gateway. HTTP inbounds in, Socket.IO outbounds out.

Backends POST messages that carry an audience; sockets authenticate with a token; each message
reaches exactly the sockets whose criteria match its audience.
"""

from .plugins import (
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
from .server import Bow

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
    "WatchesCriteria",
]
__version__ = "0.1.0"
