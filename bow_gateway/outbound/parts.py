"""What the outbound's parts (authentication, expiry, recovery) need of it: :class:`Sockets`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol, TypedDict, Unpack

from ..core.codes import Code
from ..core.history import History
from ..core.index import CriteriaIndex
from ..core.message import Event
from ..core.plugins import CreateCriteriaFromListenerDetails
from ..core.topic_index import TopicIndex
from ..runtime.metrics import Metrics
from .connection import Connection, Settings
from .receipts import Receipts
from .sessions import Sessions
from .writer import Writer


class Closing(TypedDict, total=False):
    """How a connection is closed: ``kind`` (the disconnect's reason, as metrics label it),
    ``reconnect`` (protocol 2's advice)."""

    kind: str | None
    reconnect: str | None


class Sockets(Protocol):
    """What the parts need of the outbound (:class:`~.sockets.SocketOutbound`)."""

    connections: dict[str, Connection]
    sessions: Sessions
    deadlines: dict[str, asyncio.TimerHandle]
    indices: Mapping[str, CriteriaIndex[Connection]]
    topics: dict[str, TopicIndex[Connection]]
    middlewares: Mapping[str, CreateCriteriaFromListenerDetails]
    settings: Settings
    history: History
    metrics: Metrics
    writer: Writer
    publish: Callable[[Event], Awaitable[object]]
    positioned: set[Connection]
    receipts: Receipts

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None: ...

    async def disconnect_soon(self, connection: Connection) -> None: ...

    def close(
        self, connection: Connection, code: Code, text: str, **closing: Unpack[Closing]
    ) -> None:
        """Tell ``connection`` why with a fatal alert, then close it (soon, and once)."""
