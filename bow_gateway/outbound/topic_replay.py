"""Replay from a topic's history (``clients.md`` section 14), for every client protocol: which
sequences a request names, and the messages among them the asking connection may see now.

``start`` is a sequence (messages from it on; 0: from the oldest kept) or a negative count (the
last ``-start``); at most ``max_count`` are replayed. The history is read a chunk at a time, so a
replay never holds it all; messages past their rule's ``max_age``, of another middleware version,
or whose audience the connection's criteria of now do not match are skipped. A chunk is decoded
and filtered in slices that take turns with the event loop and the other replays and recoveries
(:class:`~bow_gateway.core.history.Lane`), and each connection, and each listener id on the
instance, may start ``recovery.max_replays_per_minute`` replays a minute (:class:`ReplayLimit`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Final

from ..backplanes import Stored
from ..core.index import matches
from ..core.message import MessageEvent, decode_event
from ..core.retention import Retentions
from ..runtime.ratelimit import TokenBucket
from .connection import Connection
from .parts import Sockets

CHUNK: Final = 256  # entries read from the history at a time
MAX_COUNT: Final = 100_000  # the most one replay may ask for

Bounds = Callable[[str], Awaitable[tuple[int, int] | None]]
Read = Callable[[str, int, int], Awaitable[list[Stored]]]
Take = Callable[[Stored, MessageEvent], None]  # a message a replay may show, and its entry


class ReplayLimit:
    """``per_minute`` replays a minute (bursts as many) per connection and per listener id on
    this instance (0: no limit): token buckets, those unused for a minute (full again) dropped."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._buckets: dict[Hashable, tuple[TokenBucket, list[float]]] = {}
        self._sweep_at = 1_024  # buckets held when idle ones are dropped next

    def take(self, connection: Connection) -> bool:
        """Whether ``connection`` may start a replay now (spending one from each bucket)."""
        if not self.per_minute:
            return True
        now = time.monotonic()
        if len(self._buckets) >= self._sweep_at:
            self._sweep(now)
        listener_id = connection.listener_id
        if listener_id is not None and not self._take(("id", listener_id), now):
            return False
        return self._take(("connection", connection.sid), now)

    def _take(self, key: Hashable, now: float) -> bool:
        held = self._buckets.get(key)
        if held is None:
            rate = self.per_minute / 60.0
            held = self._buckets[key] = (TokenBucket(rate, float(self.per_minute)), [now])
        held[1][0] = now
        return held[0].take()

    def _sweep(self, now: float) -> None:
        idle = now - 60.0
        for key in [key for key, (_, used) in self._buckets.items() if used[0] < idle]:
            del self._buckets[key]
        self._sweep_at = max(1_024, 2 * len(self._buckets))


class TopicHistory:
    """Reads topic histories for the outbound's connections."""

    def __init__(
        self,
        bounds: Bounds,
        read: Read,
        retentions: Retentions,
        *,
        max_replays_per_minute: int = 120,
    ) -> None:
        self._bounds = bounds
        self._read = read
        self.retentions = retentions
        self.limit = ReplayLimit(max_replays_per_minute)

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
        take: Take | None = None,
    ) -> AsyncIterator[list[MessageEvent]]:
        """The messages of ``topic`` from sequence ``begin`` that ``connection`` may see now, at
        most ``count`` read (``until``: stop at the first entry it says is past the end), a
        chunk's at a time (a list, maybe empty), decoded in slices on the history's lane.

        ``take``: each message is given to it instead, with the entry it was read from, as it is
        decoded (in the slice that decoded it), and the chunks are empty: a reader that keeps
        what it needs (the entry, to decode it again later) holds no decoded message of its
        own."""
        events: list[MessageEvent] = []
        if take is None:

            def take(stored: Stored, event: MessageEvent) -> None:
                events.append(event)

        rule = self.retentions.rule_for(topic)
        if rule is None or count <= 0:
            return
        version = connection.outbound.middleware_version
        left, sequence = count, begin
        slices = outbound.history.lane.slices()
        while left > 0:
            asked = min(CHUNK, left)
            chunk = await self._read(topic, sequence, asked)
            oldest = time.time() - rule.max_age
            ended = len(chunk) < asked  # the end of the history
            await slices.begin()
            try:
                for stored in chunk:
                    key = connection.key
                    entries = None if key is None else outbound.indices[version].entries_of(key)
                    if entries is None or connection.closing is not None:
                        return  # no longer a listener: nothing more for it
                    if until is not None and until(stored):
                        ended = True
                        break
                    left -= 1
                    sequence = stored.sequence + 1
                    if stored.time >= oldest:
                        event = decode_event(stored.data)
                        if (
                            isinstance(event, MessageEvent)
                            and event.middleware_version == version
                            and matches(entries, connection.listener_id, event.message.audience)
                        ):
                            take(stored, event)
                    if slices.due():
                        await slices.pause()
            finally:
                slices.end()
            chunk_events, events = events, []
            yield chunk_events
            if ended:
                return
