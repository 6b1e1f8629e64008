"""The backplane: how events reach every instance of one gateway, all in one order.

Backends sit behind one small async interface, chosen from the ``redis`` setting the way
encode's broadcaster picks one by URL scheme: ``None`` keeps everything in this process.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator
from typing import Any


class BackplaneUnavailable(Exception):
    """The backplane cannot take an event now; the inbound answers 503 with ``Retry-After``."""

    def __init__(self, reason: str, retry_after: float = 1.0) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class Backplane(abc.ABC):
    """Carries opaque events from any instance to every instance, in one order."""

    @abc.abstractmethod
    async def connect(self) -> None:
        """Get ready to publish; :meth:`events` yields what is published from now on."""

    @abc.abstractmethod
    async def disconnect(self) -> None:
        """Stop: :meth:`events` ends, :meth:`publish` refuses."""

    @abc.abstractmethod
    async def publish(self, data: bytes) -> None:
        """Hand ``data`` over for delivery, or raise :class:`BackplaneUnavailable`.

        Once this returns, the event is not lost: every instance's :meth:`events` yields it.
        """

    @abc.abstractmethod
    def events(self) -> AsyncIterator[bytes]:
        """Every event published by any instance, in one order, until :meth:`disconnect`."""

    @property
    @abc.abstractmethod
    def ready(self) -> bool:
        """Whether :meth:`publish` can take events now (``GET /health`` says 503 when not)."""


class MemoryBackplane(Backplane):
    """One instance, no Redis: a bounded in-process queue between the inbound and the sockets."""

    def __init__(self, max_pending: int = 10_000) -> None:
        self._max_pending = max_pending
        self._queue: asyncio.Queue[bytes | None] | None = None

    async def connect(self) -> None:
        # The bound is kept by publish(), so that disconnect() can always add the end marker.
        self._queue = asyncio.Queue()

    async def disconnect(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            queue.put_nowait(None)

    async def publish(self, data: bytes) -> None:
        if self._queue is None:
            raise BackplaneUnavailable("the gateway is not running")
        if self._queue.qsize() >= self._max_pending:
            raise BackplaneUnavailable(
                f"{self._max_pending} events are already waiting for delivery"
            )
        self._queue.put_nowait(data)

    async def events(self) -> AsyncIterator[bytes]:
        queue = self._queue
        if queue is None:
            return
        while (data := await queue.get()) is not None:
            yield data

    @property
    def ready(self) -> bool:
        return self._queue is not None


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
    from .redis import RedisBackplane

    return RedisBackplane(
        redis,
        namespace=namespace,
        max_len=max_len,
        connect_retries=connect_retries,
        publish_timeout=publish_timeout,
    )
