"""What the outbound's parts (authentication, expiry, recovery) need of it: :class:`Sockets`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol

from ..core.codes import Code
from ..core.history import History
from ..core.index import CriteriaIndex
from ..core.message import Event
from ..core.plugins import CreateCriteriaFromListenerDetails
from ..core.topics import TopicIndex
from ..runtime.metrics import Metrics
from .connection import Connection, Settings
from .sessions import Sessions
from .writer import Writer


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

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None: ...

    async def disconnect_soon(self, connection: Connection) -> None: ...

    def close(
        self,
        connection: Connection,
        code: Code,
        text: str,
        *,
        kind: str | None = None,
        reconnect: str | None = None,
    ) -> None: ...
