"""One connection's state, whatever protocol it speaks, and the outbound's settings."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.criteria import ListenerId
from ..core.index import IndexKey
from ..core.plugins import OutboundPlugin
from ..runtime.ratelimit import TokenBucket, rate_limited
from .codec import PROTOCOL_1, Codec

# A line or two per connection: rate-limited, since clients choose how many connections to open
logger = rate_limited("bow_gateway.outbound", rate=50.0, burst=500.0)


@dataclass(frozen=True, slots=True)
class Settings:
    """The outbound's limits and protocol-2 behaviour (section 10 and the ``recovery`` keys)."""

    auth_timeout: float = 5.0
    max_buffered_bytes: int = 1_048_576
    expiry_grace: float = 25.0
    expire_v1_sockets: bool = False
    max_sockets_per_id: int = 100
    max_buffered_bytes_per_id: int = 4_194_304
    max_anonymous: int = 10_000
    max_authenticates_per_minute: int = 12
    max_filters: int = 100
    max_filters_per_id: int = 1_000
    max_filters_per_instance: int = 200_000
    max_publishes_per_second: int = 100
    recovery_enabled: bool = True
    max_replay: int = 1_000
    position_interval: float = 30.0


class Packets(Protocol):
    """A connection's transport while it is not a byte stream the writer writes frames to:
    Socket.IO's Engine.IO session, long-polling (or upgrading) until :attr:`transport` is set."""

    closed: bool

    @property
    def queued_bytes(self) -> int:
        """Bytes of packets queued and not fetched by the client yet."""
        ...

    @property
    def transport(self) -> asyncio.Transport | None:
        """Set once it is a websocket: frames are written straight to it."""
        ...

    def enqueue(self, data: str) -> bool:
        """Queue one packet for the client's next fetch; False when closed."""
        ...


class Connection:
    """One connection, from connect to disconnect: Socket.IO unless its ``codec`` says otherwise."""

    __slots__ = (
        "authenticates",
        "backlog",
        "backlog_bytes",
        "busy",
        "claimed",
        "closing",
        "codec",
        "details",
        "eio_sid",
        "ended",
        "exp",
        "farewell",
        "held",
        "held_bytes",
        "key",
        "listener_id",
        "lock",
        "outbound",
        "positioned_at",
        "publishes",
        "replaying",
        "session",
        "sid",
        "socket",
        "timer",
        "transport",
        "wrote_in",
    )

    def __init__(
        self,
        sid: str,
        eio_sid: str,
        outbound: OutboundPlugin,
        *,
        socket: Packets | None = None,
        authenticates_per_minute: int = 12,
        codec: Codec | None = None,
    ) -> None:
        self.sid = sid
        self.eio_sid = eio_sid
        self.outbound = outbound
        # How what is delivered to it is framed, and what its protocol can tell its client: one
        # codec per wire protocol, shared (Socket.IO's protocol 1, Bow's wire, by default)
        self.codec: Codec = codec if codec is not None else PROTOCOL_1
        self.socket = socket
        self.key: IndexKey | None = None  # in the index under it once authenticated
        self.listener_id: ListenerId | None = None  # None while anonymous
        self.details: Mapping[str, Any] | None = None  # kept if the middleware watches changes
        self.busy = False  # an authenticate under way (protocol 1 ignores another meanwhile)
        self.lock: asyncio.Lock | None = None  # protocol 2: authenticates run one at a time
        self.authenticates = TokenBucket(authenticates_per_minute / 60, authenticates_per_minute)
        self.claimed = False  # holds a place among its id's sockets (max_sockets_per_id)
        self.exp: float | None = None  # its listener details' exp, when enforced
        self.timer: asyncio.TimerHandle | None = None  # refresh_required, then token_expired
        self.positioned_at = 0.0  # loop time of the last positioned event sent (protocol 2)
        self.closing: str | None = None  # why the gateway is closing it (refused, slow, ...)
        # Set once the socket is a websocket (LeanSocket.transport): frames are written to it.
        self.transport: asyncio.Transport | None = None
        # While a replay is written: what waits behind it, encoded; None otherwise.
        self.backlog: deque[bytes] | None = None
        self.backlog_bytes = 0
        self.replaying = 0  # how many of the first packets of the backlog are the replay's
        # Frames written within one event-loop step after its first (:class:`.writer.Writer`)
        self.held: list[bytes] | None = None
        self.held_bytes = 0
        self.wrote_in = -1  # the writer's step of the last frame written to its transport
        # An SSE stream's or a plain websocket's: done when the gateway ends it (or its client
        # went); its handler then closes it with ``farewell``, the code and why
        self.ended: asyncio.Future[None] | None = None
        self.farewell: tuple[int, str] | None = None
        # The client's own name for the connection: Flywheel's sessionId ($remote/{it}/rx),
        # Gobbler's applicationId
        self.session: str | None = None
        self.publishes: TokenBucket | None = None  # a client that publishes: its rate

    @property
    def authenticated(self) -> bool:
        return self.key is not None
