"""The in-process backplane: one instance, no Redis, a bounded queue between inbound and sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from .base import Backplane, BackplaneUnavailable


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
