"""The gateway's reader of the audience index the criteria job writes: which listeners of the
whole base, connected or not, match an audience (layout: :mod:`bow_gateway.core.audience_layout`).

Bitmaps are loaded lazily, only those an audience names, and kept in a bounded LRU cache that is
dropped when another generation goes live; every answer comes from one generation. ``__id``
predicates are resolved through the criteria snapshot (the listener's criteria, with one
``HGET``), and the listener's number found among the listeners with the same criteria.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pyroaring import BitMap
from redis.asyncio import Redis, RedisCluster

from ..core.audience_layout import CHUNK, IndexLayout, IndexPointer, pair_token
from ..core.criteria import ID_KEY, ListenerId, is_listener_id, is_scalar
from ..core.criteria_snapshot import Layout, Live
from ..core.index import entries_of, matches


@dataclass(frozen=True)
class Reach:
    """The numbers of the listeners an audience matches, in one generation of the index."""

    listeners: BitMap
    generation: str

    def __len__(self) -> int:
        return len(self.listeners)


class _Lru(OrderedDict[Any, Any]):
    """A dict that forgets its least recently used items past ``size``."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def get_fresh(self, key: Any) -> Any:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class AudienceIndex:
    """Reads one namespace's audience index with an async redis-py client (bytes replies; a
    cluster's too: the two pointers share a slot, the bitmaps are read pipelined)."""

    def __init__(
        self,
        client: Redis | RedisCluster,
        namespace: str = "bow",
        *,
        max_bitmaps: int = 4096,
        max_chunks: int = 256,
        check_seconds: float = 1.0,
    ) -> None:
        if max_bitmaps < 1 or max_chunks < 1 or check_seconds < 0:
            raise ValueError("max_bitmaps and max_chunks must be >= 1, check_seconds >= 0")
        self.client = client
        self.layout = IndexLayout(namespace)
        self.criteria_layout = Layout(namespace)
        self.check_seconds = check_seconds
        self._bitmaps = _Lru(max_bitmaps)
        self._chunks = _Lru(max_chunks)
        self._pointer: IndexPointer | None = None
        self._live: Live | None = None
        self._checked = float("-inf")

    async def current(self) -> IndexPointer | None:
        """The live generation (read at most every ``check_seconds``); a new one drops the
        caches."""
        now = time.monotonic()
        if now - self._checked < self.check_seconds:
            return self._pointer
        raw_index, raw_live = await self.client.mget(
            [self.layout.pointer_key, self.criteria_layout.live_key]
        )
        pointer = IndexPointer.from_json(raw_index)
        if pointer is None or self._pointer is None or pointer != self._pointer:
            self._bitmaps.clear()
            self._chunks.clear()
        self._pointer, self._live = pointer, Live.from_json(raw_live)
        self._checked = now
        return pointer

    async def matching(self, audience: Sequence[Mapping[str, Any]]) -> Reach | None:
        """The listeners matching ``audience`` (OR of queries, AND of predicates); ``None``
        when no index is live."""
        pointer = await self.current()
        if pointer is None:
            return None
        live = self._live
        generation = pointer.generation
        found = BitMap()
        for query in audience:
            if ID_KEY in query:
                found |= await self._by_id(generation, pointer, live, query)
                continue
            found |= await self._query(generation, query)
        return Reach(found, generation)

    async def _query(self, generation: str, query: Mapping[str, Any]) -> BitMap:
        return await self._intersect(generation, [_pair(k, v) for k, v in query.items()])

    async def _intersect(self, generation: str, pairs: list[str]) -> BitMap:
        """The listeners holding every pair."""
        bitmaps = await self._load(generation, pairs)
        if not bitmaps:
            return BitMap()
        bitmaps.sort(key=len)
        result = BitMap(bitmaps[0])
        for bitmap in bitmaps[1:]:
            if not result:
                break
            result &= bitmap
        return result

    async def _by_id(
        self,
        generation: str,
        pointer: IndexPointer,
        live: Live | None,
        query: Mapping[str, Any],
    ) -> BitMap:
        """``{__id: X, ...}``: X's number if X's criteria (from the snapshot) match the query."""
        listener_id = query[ID_KEY]
        if live is None or not is_listener_id(listener_id):
            return BitMap()
        key, field = self.criteria_layout.key_of(live.snapshot, live.buckets, listener_id)
        raw = await self.client.hget(key, field)
        if raw is None:
            return BitMap()
        criteria = live.criteria(raw)
        if not matches(entries_of(criteria), listener_id, [query]):
            return BitMap()
        pairs = [_pair(k, v) for k, values in criteria.items() for v in _listed(values)]
        # the listeners holding every pair of X's criteria: X is one of them
        candidates = (
            await self._intersect(generation, pairs) if pairs else BitMap(range(pointer.next))
        )
        return await self._find(generation, candidates, field)

    async def _find(self, generation: str, candidates: BitMap, field: str) -> BitMap:
        """The number among ``candidates`` whose id field is ``field``."""
        for number in candidates:  # in order: each chunk is read once
            lines = await self._chunk(generation, number // CHUNK)
            offset = number % CHUNK
            if offset < len(lines) and lines[offset] == field:
                return BitMap([number])
        return BitMap()

    async def _load(self, generation: str, pairs: list[str]) -> list[BitMap]:
        """The bitmaps of ``pairs`` (an empty one for a pair no listener holds), from the cache
        or with one ``MGET``-like pipeline for those it lacks."""
        found: dict[str, BitMap] = {}
        missing = []
        for pair in dict.fromkeys(pairs):
            held = self._bitmaps.get_fresh(pair)
            if held is None:
                missing.append(pair)
            else:
                found[pair] = held
        if missing:
            pipe = self.client.pipeline(transaction=False)
            for pair in missing:
                pipe.get(self.layout.bitmap_key(generation, pair))
            for pair, raw in zip(missing, await pipe.execute(), strict=True):
                bitmap = BitMap() if raw is None else BitMap.deserialize(raw)
                self._bitmaps.put(pair, bitmap)
                found[pair] = bitmap
        return list(found.values())

    async def _chunk(self, generation: str, chunk: int) -> list[str]:
        held: list[str] | None = self._chunks.get_fresh(chunk)
        if held is None:
            raw = await self.client.get(self.layout.ids_key(generation, chunk))
            text = raw.decode() if isinstance(raw, bytes) else raw or ""
            held = text.split("\n")
            self._chunks.put(chunk, held)
        return held

    async def listener_ids(self, numbers: BitMap, limit: int) -> list[ListenerId]:
        """The ids of the first ``limit`` of ``numbers`` (of the live generation), as their JSON
        gives them (``42`` and ``"42"`` differ); numbers without a listener are skipped."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        pointer = await self.current()
        if pointer is None or limit == 0:
            return []
        found: list[ListenerId] = []
        chunk, lines = -1, []
        for number in numbers:
            if number // CHUNK != chunk:  # a chunk at a time, the loop let go in between
                chunk = number // CHUNK
                lines = await self._chunk(pointer.generation, chunk)
                await asyncio.sleep(0)
            offset = number % CHUNK
            if offset < len(lines) and lines[offset]:
                found.append(orjson.loads(lines[offset]))
                if len(found) >= limit:
                    break
        return found


def _pair(key: str, value: Any) -> str:
    if not is_scalar(value):
        raise ValueError(f"predicate {key!r}: {value!r} is not a criterion value")
    return pair_token(key, value)


def _listed(values: Any) -> list[Any]:
    return values if isinstance(values, list) else [values]
