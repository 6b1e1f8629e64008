"""The in-process backplane: one instance, no Redis, a bounded queue between inbound and sockets."""

from __future__ import annotations

import asyncio
import secrets
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable

from .base import Backplane, BackplaneUnavailable, Entry, Gap


class MemoryBackplane(Backplane):
    """One instance, no Redis: a bounded in-process queue between the inbound and the sockets.

    Its history is this process's: a restart starts a new epoch.
    """

    def __init__(self, max_pending: int = 10_000) -> None:
        self._max_pending = max_pending
        self._queue: asyncio.Queue[Entry | None] | None = None
        self._epoch = secrets.token_hex(4)
        self._count = 0
        self._answers: dict[str, list[bytes]] = {}
        self._claims: defaultdict[str, set[str]] = defaultdict(set)

    @property
    def epoch(self) -> str:
        return self._epoch

    async def connect(self) -> None:
        # The bound is kept by publish(), so that disconnect() can always add the end marker.
        self._queue = asyncio.Queue()

    async def disconnect(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            queue.put_nowait(None)

    async def publish(self, data: bytes) -> str:
        if self._queue is None:
            raise BackplaneUnavailable("the gateway is not running")
        if self._queue.qsize() >= self._max_pending:
            raise BackplaneUnavailable(
                f"{self._max_pending} events are already waiting for delivery"
            )
        self._count += 1
        position = f"{self._epoch}.{self._count}"
        self._queue.put_nowait(Entry(position, data))
        return position

    async def events(self) -> AsyncIterator[Entry | Gap]:
        queue = self._queue
        if queue is None:
            return
        while (entry := await queue.get()) is not None:
            yield entry

    async def backlog(self, count: int) -> list[Entry]:
        return []

    def parse_position(self, position: str) -> tuple[str, tuple[int, ...]] | None:
        epoch, dot, number = position.partition(".")
        if not dot or not epoch or not number.isdigit() or len(position) > 64:
            return None
        return epoch, (int(number),)

    async def answer(self, request_id: str, data: bytes) -> None:
        answers = self._answers.get(request_id)
        if answers is not None:
            answers.append(data)

    async def answers(
        self, request_id: str, publish: Callable[[], Awaitable[str]], timeout: float = 0.5
    ) -> tuple[list[bytes], bool]:
        answers: list[bytes] = []
        self._answers[request_id] = answers
        try:
            await publish()
            async with asyncio.timeout(timeout):
                while not answers:
                    await asyncio.sleep(0.001)
        except TimeoutError:
            return answers, False
        finally:
            del self._answers[request_id]
        return answers, True

    async def claim(self, key: str, member: str, limit: int) -> bool:
        members = self._claims[key]
        if limit and len(members) >= limit and member not in members:
            return False
        members.add(member)
        return True

    async def release(self, key: str, member: str) -> None:
        members = self._claims.get(key)
        if members is not None:
            members.discard(member)
            if not members:
                del self._claims[key]

    @property
    def ready(self) -> bool:
        return self._queue is not None
