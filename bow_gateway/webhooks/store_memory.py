"""The webhook store of a gateway without Redis: everything in this process, so a restart loses
what waits (the in-process backplane's promise: one instance, not durable)."""

from __future__ import annotations

import asyncio
import secrets
from collections import deque
from collections.abc import Sequence
from itertools import count

from .events import WebhookEvent, loaded
from .store import Finished, Stored, for_replay


class MemoryWebhookStore:
    """:class:`~.store.WebhookStore` in memory: at most ``max_backlog`` entries wait, at most
    ``max_dead`` dead letters (and as many overflowed events) are kept, the oldest dropped."""

    def __init__(self, *, max_backlog: int = 100_000, max_dead: int = 10_000) -> None:
        self.max_backlog = max_backlog
        self.max_dead = max_dead
        self._prefix = secrets.token_hex(4)  # ids never reused by another process
        self._ids = count(1)
        self._entries: dict[str, Stored] = {}  # waiting, taken or not, in order
        self._unread: deque[str] = deque()
        self._done: dict[str, set[str]] = {}
        self._overflow: deque[Stored] = deque(maxlen=max_dead)
        self._dead: deque[bytes] = deque(maxlen=max_dead)
        self._wake = asyncio.Event()

    def _new_id(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    async def append(self, events: Sequence[WebhookEvent]) -> int:
        stored = 0
        for event in events:
            entry = Stored(self._new_id(), event)
            if len(self._entries) >= self.max_backlog:
                self._overflow.append(entry)
                continue
            self._add(entry)
            stored += 1
        return stored

    def _add(self, entry: Stored) -> None:
        self._entries[entry.id] = entry
        self._unread.append(entry.id)
        self._wake.set()

    async def hold(self) -> bool:
        return True

    async def release(self) -> None:
        return None

    async def begin(self) -> None:
        self._unread = deque(self._entries)

    async def take(self, limit: int, timeout: float) -> list[Stored]:
        if not self._unread:
            self._wake.clear()
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                return []
        taken: list[Stored] = []
        while self._unread and len(taken) < limit:
            entry_id = self._unread.popleft()
            entry = self._entries.get(entry_id)
            if entry is not None:
                done = frozenset(self._done.get(entry_id, ()))
                taken.append(Stored(entry.id, entry.event, entry.tag, entry.webhook_id, done))
        return taken

    async def finish(self, finished: Sequence[Finished]) -> None:
        for item in finished:
            if item.letter is not None:
                self._dead.append(item.letter)
            done = self._done.setdefault(item.entry, set())
            done.add(item.tag)
            if len(done) >= item.targets:
                self._entries.pop(item.entry, None)
                del self._done[item.entry]

    async def overflowed(self, limit: int) -> list[Stored]:
        return list(self._overflow)[:limit]

    async def bury(self, ids: Sequence[str], letters: Sequence[bytes]) -> None:
        gone = set(ids)
        self._overflow = deque((e for e in self._overflow if e.id not in gone), self.max_dead)
        self._dead.extend(letters)

    async def dead(self, limit: int) -> list[bytes]:
        return list(self._dead)[:limit]

    async def replay(self, webhook_ids: Sequence[str]) -> int:
        wanted = set(webhook_ids)
        kept: deque[bytes] = deque(maxlen=self.max_dead)
        replayed = 0
        for letter in self._dead:
            webhook_id, tag, event = for_replay(letter)
            if webhook_id not in wanted or len(self._entries) >= self.max_backlog:
                kept.append(letter)
                continue
            wanted.discard(webhook_id)  # once, however often it is named
            self._add(Stored(self._new_id(), loaded(event), tag, webhook_id))
            replayed += 1
        self._dead = kept
        return replayed

    async def depth(self) -> int:
        return len(self._entries)

    async def close(self) -> None:
        return None
