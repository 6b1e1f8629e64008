"""Replay from a topic's history (``clients.md`` section 14), for every client protocol: which
sequences a request names, and the messages among them the asking connection may see now.

``start`` is a sequence (messages from it on; 0: from the oldest kept) or a negative count (the
last ``-start``); at most ``max_count`` are replayed. The history is read a chunk at a time, so a
replay never holds it all; messages past their rule's ``max_age``, of another middleware version,
or whose audience the connection's criteria of now do not match are skipped.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from ..backplanes import Stored
from ..index import matches
from ..message import MessageEvent, decode_event
from ..retention import Retentions
from .connection import Connection
from .parts import Sockets

CHUNK: Final = 256  # entries read from the history at a time
MAX_COUNT: Final = 100_000  # the most one replay may ask for

Bounds = Callable[[str], Awaitable[tuple[int, int] | None]]
Read = Callable[[str, int, int], Awaitable[list[Stored]]]


class TopicHistory:
    """Reads topic histories for the outbound's connections."""

    def __init__(self, bounds: Bounds, read: Read, retentions: Retentions) -> None:
        self._bounds = bounds
        self._read = read
        self.retentions = retentions

    def kept(self, topic: str) -> bool:
        """Whether a history rule keeps ``topic``."""
        return self.retentions.rule_for(topic) is not None

    async def span(self, topic: str, start: int, max_count: int | None) -> tuple[int, int]:
        """The first sequence to read and how many at most (0: nothing to replay)."""
        bounds = await self._bounds(topic)
        if bounds is None:
            return 0, 0
        first, last = bounds
        begin = max(first, last + start + 1) if start < 0 else max(first, start)
        count = last - begin + 1
        if max_count is not None:
            count = min(count, max_count)
        return begin, max(0, count)

    async def replay(
        self,
        outbound: Sockets,
        connection: Connection,
        topic: str,
        begin: int,
        count: int,
        *,
        until: Callable[[Stored], bool] | None = None,
    ) -> AsyncIterator[MessageEvent]:
        """The messages of ``topic`` from sequence ``begin`` that ``connection`` may see now, at
        most ``count`` read (``until``: stop at the first entry it says is past the end)."""
        rule = self.retentions.rule_for(topic)
        if rule is None or count <= 0:
            return
        version = connection.outbound.middleware_version
        left, sequence = count, begin
        while left > 0:
            asked = min(CHUNK, left)
            chunk = await self._read(topic, sequence, asked)
            oldest = time.time() - rule.max_age
            key = connection.key
            entries = None if key is None else outbound.indices[version].entries_of(key)
            if entries is None or connection.closing is not None:
                return  # no longer a listener: nothing more for it
            for stored in chunk:
                if until is not None and until(stored):
                    return
                left -= 1
                sequence = stored.sequence + 1
                if stored.time < oldest:
                    continue
                event = decode_event(stored.data)
                if (
                    isinstance(event, MessageEvent)
                    and event.middleware_version == version
                    and matches(entries, connection.listener_id, event.message.audience)
                ):
                    yield event
            if len(chunk) < asked:
                return  # the end of the history
