"""What a lean Engine.IO socket keeps beside engineio's own state: :class:`LeanState`, and the
queue that stands in for engineio's once the socket writes straight to its websocket."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Final

from engineio import packet as eio_packet

from ..runtime.ratelimit import TokenBucket
from .guard import ProtocolViolation


class Drained:
    """engineio's queue once a socket writes straight to its websocket: nothing waits in it again.

    An ``asyncio.Queue`` holds four deques, ~3 KB per socket for its whole life.
    """

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def put_nowait(self, item: Any) -> None:
        pass

    async def put(self, item: Any) -> None:
        pass

    async def join(self) -> None:
        pass


DRAINED: Final = Drained()


class LeanState:
    """What :class:`LeanSocket` adds to engineio's socket, in one object with slots: engineio's
    socket keeps its attributes inline in the object while few are added (~0.2 KB), and turns
    them into a dict of its own (~0.9 KB) once more are."""

    __slots__ = (
        "closer",
        "inbox",
        "incoming",
        "ping_due",
        "poll_timer",
        "polls",
        "queued_bytes",
        "reader",
        "transport",
        "websocket",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None  # while a websocket
        self.queued_bytes = 0  # what waits in engineio's queue for a long-poll
        self.websocket: Any = None  # its driver, once upgraded
        self.ping_due: float | None = None  # the tick of the ping wheel it is pinged at
        self.poll_timer: asyncio.TimerHandle | None = None
        self.closer: asyncio.Future[Any] | None = None
        self.incoming: TokenBucket | None = None
        self.inbox: deque[eio_packet.Packet | ProtocolViolation | None] | None = None
        self.reader: asyncio.Task[None] | None = None  # reads the inbox while it holds some
        self.polls = 0  # long-polling GETs under way
