"""The backplane interface: how events reach every instance of one gateway, all in one order.

Every backend (:mod:`.memory`, :mod:`.redis`) implements :class:`Backplane`, and refuses what it
cannot take with :class:`BackplaneUnavailable`, which the inbound answers with ``503``.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass


class BackplaneUnavailable(Exception):
    """The backplane cannot take an event now; the inbound answers 503 with ``Retry-After``."""

    def __init__(self, reason: str, retry_after: float = 1.0) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Entry:
    """One event read from the backplane, with its position in the history."""

    position: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Gap:
    """The history is broken here: events may be missing before ``position``."""

    position: str
    reason: str


class Backplane(abc.ABC):
    """Carries opaque events from any instance to every instance, in one order."""

    @abc.abstractmethod
    async def connect(self) -> None:
        """Get ready to publish; :meth:`events` yields what is published from now on."""

    @abc.abstractmethod
    async def disconnect(self) -> None:
        """Stop: :meth:`events` ends, :meth:`publish` refuses."""

    @abc.abstractmethod
    async def publish(self, data: bytes) -> str:
        """Hand ``data`` over for delivery, or raise :class:`BackplaneUnavailable`.

        Once this returns, the event is not lost: every instance's :meth:`events` yields it.
        """

    @abc.abstractmethod
    def events(self) -> AsyncIterator[Entry | Gap]:
        """Every event published by any instance, in one order, until :meth:`disconnect`."""

    @property
    @abc.abstractmethod
    def ready(self) -> bool:
        """Whether :meth:`publish` can take events now (``GET /health`` says 503 when not)."""

    @abc.abstractmethod
    async def backlog(self, count: int) -> list[Entry]:
        """The newest ``count`` entries already in the history at connect, oldest first."""

    @abc.abstractmethod
    def parse_position(self, position: str) -> tuple[str, tuple[int, ...]] | None:
        """``(epoch, sortable key)`` of a position, or None if it is not one."""

    @abc.abstractmethod
    async def answer(self, request_id: str, data: bytes) -> None:
        """This instance's answer to a request."""

    @abc.abstractmethod
    async def answers(
        self, request_id: str, publish: Callable[[], Awaitable[str]], timeout: float = 0.5
    ) -> tuple[list[bytes], bool]:
        """Publish a request, then collect every live instance's answer: (answers, complete)."""

    @abc.abstractmethod
    async def claim(self, key: str, member: str, limit: int) -> bool:
        """Add ``member`` to ``key`` unless ``limit`` live members hold it (0: no limit)."""

    @abc.abstractmethod
    async def release(self, key: str, member: str) -> None:
        """Remove ``member`` from ``key``."""
