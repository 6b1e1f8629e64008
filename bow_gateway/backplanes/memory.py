"""The in-process backplane: one instance, no Redis, a bounded queue between inbound and sockets."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from .base import Backplane, BackplaneUnavailable, Entry, Gap

_POSITION: Final = re.compile(r"([0-9a-z]{1,32})\.([0-9]{1,20})")


class MemoryBackplane(Backplane):
    """One instance, no Redis: a bounded in-process queue between the inbound and the sockets.

    Its history lives in this process only, so each backplane starts a new random epoch, and its
    positions are ``"{epoch}.{n}"``, ``n`` counting from 1.
    """

    def __init__(self, max_pending: int = 10_000) -> None:
        self._max_pending = max_pending
        self._queue: asyncio.Queue[Entry | None] | None = None
        self._epoch = secrets.token_hex(6)
        self._count = 0
        self._asks: dict[str, tuple[list[bytes], asyncio.Event]] = {}
        self._claims: dict[str, set[str]] = {}

    async def connect(self) -> None:
        # The bound is kept by publish(), so that disconnect() can always add the end marker.
        self._queue = asyncio.Queue()

    async def disconnect(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            queue.put_nowait(None)

    async def publish(self, data: bytes) -> str:
        return self._put([data])[0]

    async def publish_many(self, events: list[bytes]) -> list[str]:
        """All of ``events`` or none: refused while ``max_pending`` events wait, so that a batch
        may pass the bound by its own size at most."""
        return self._put(events)

    def _put(self, events: list[bytes]) -> list[str]:
        queue = self._queue
        if queue is None:
            raise BackplaneUnavailable("the gateway is not running")
        if queue.qsize() >= self._max_pending:
            raise BackplaneUnavailable(
                f"{self._max_pending} events are already waiting for delivery"
            )
        positions = []
        for data in events:
            self._count += 1
            position = f"{self._epoch}.{self._count}"
            queue.put_nowait(Entry(position, data))
            positions.append(position)
        return positions

    async def events(self) -> AsyncIterator[Entry | Gap]:
        queue = self._queue
        if queue is None:
            return
        while (entry := await queue.get()) is not None:
            yield entry

    async def backlog(self, count: int) -> list[Entry]:
        """Nothing: a new process starts a new history."""
        return []

    def origin(self) -> str | None:
        return f"{self._epoch}.0"

    def parse_position(self, position: str) -> tuple[str, tuple[int, ...]] | None:
        match = _POSITION.fullmatch(position)
        return None if match is None else (match[1], (int(match[2]),))

    @property
    def epoch(self) -> str:
        return self._epoch

    @property
    def ready(self) -> bool:
        return self._queue is not None

    async def answer(self, request_id: str, data: bytes) -> None:
        """Collected if :meth:`answers` waits for ``request_id``, else dropped."""
        if (ask := self._asks.get(request_id)) is not None:
            ask[0].append(data)
            ask[1].set()

    async def answers(
        self, request_id: str, publish: Callable[[], Awaitable[str]], timeout: float
    ) -> tuple[list[bytes], bool]:
        """The one instance's answer (this one), or ``([], False)`` without it in time."""
        got: list[bytes] = []
        answered = asyncio.Event()
        self._asks[request_id] = (got, answered)
        try:
            await publish()
            try:
                async with asyncio.timeout(timeout):
                    await answered.wait()
            except TimeoutError:
                pass
            return list(got), bool(got)
        finally:
            del self._asks[request_id]

    async def claim(self, key: str, member: str, limit: int) -> bool:
        members = self._claims.setdefault(key, set())
        if member not in members and limit and len(members) >= limit:
            return False
        members.add(member)
        return True

    async def release(self, key: str, member: str) -> None:
        members = self._claims.get(key)
        if members is not None:
            members.discard(member)
            if not members:
                del self._claims[key]
