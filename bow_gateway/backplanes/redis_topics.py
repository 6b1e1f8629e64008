"""The Redis backplane's topic histories: a stream ``{namespace}:topic:{topic}`` per kept topic,
whose ids are ``{sequence}-{ms}`` (the writer's script appends to it). A mixin of
:class:`~bow_gateway.backplanes.redis.RedisBackplane`."""

from __future__ import annotations

import abc
from typing import Any

from .base import BackplaneUnavailable, Stored
from .redis_ids import as_text
from .redis_instances import FAILURES
from .redis_reader import FIELD, Client, cause

POSITION_FIELD = b"p"  # a topic history's entry: where the event is in the stream


class TopicHistories(abc.ABC):
    """Reading a kept topic's history: its bounds, a range of it (a part of the Redis backplane,
    which gives it its client)."""

    namespace: str

    @abc.abstractmethod
    def _connected(self) -> Client:
        """The backplane's client, once connected."""

    def topic_key(self, topic: str) -> str:
        return f"{{{self.namespace}}}:topic:{topic}"

    async def topic_bounds(self, topic: str) -> tuple[int, int] | None:
        client = self._connected()
        key = self.topic_key(topic)
        try:
            pipeline = client.pipeline(transaction=False)
            pipeline.xrange(key, "-", "+", count=1)
            pipeline.xrevrange(key, "+", "-", count=1)
            first, last = await pipeline.execute()
        except FAILURES as exc:
            raise BackplaneUnavailable(f"Redis did not answer: {cause(exc)}") from exc
        if not first or not last:
            return None
        return _sequence_of(first[0][0]), _sequence_of(last[0][0])

    async def topic_read(self, topic: str, start: int, count: int) -> list[Stored]:
        client = self._connected()
        if count <= 0:
            return []
        try:
            entries: Any = await client.xrange(
                self.topic_key(topic), f"{max(start, 0)}-0", "+", count
            )
        except FAILURES as exc:
            raise BackplaneUnavailable(f"Redis did not answer: {cause(exc)}") from exc
        return [
            Stored(
                _sequence_of(entry_id),
                fields[FIELD],
                _ms_of(entry_id) / 1000,
                as_text(fields[POSITION_FIELD]),
            )
            for entry_id, fields in entries
        ]


def _sequence_of(entry_id: Any) -> int:
    """A topic history's id ``{sequence}-{ms}``: the sequence."""
    return int(as_text(entry_id).partition("-")[0])


def _ms_of(entry_id: Any) -> int:
    return int(as_text(entry_id).partition("-")[2])
