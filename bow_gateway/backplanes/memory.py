"""The in-process backplane: one instance, no Redis, a bounded queue between inbound and sockets."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from ..core.retention import Retention
from .base import (
    AlreadyAccepted,
    Backplane,
    BackplaneUnavailable,
    Claim,
    Entry,
    Gap,
    Report,
    Stored,
    with_sequence,
)

_POSITION: Final = re.compile(r"([0-9a-z]{1,32})\.[0-9a-f]{12}\.([0-9]{1,20})")
LOCAL: Final = "local"
"""The one instance's id, as its reports name it."""
TAG_BYTES: Final = 6  # random bytes of a position's tag (12 hex digits)


def exact(data: bytes) -> bytes:
    """A copy of ``data`` that holds its length and no more, as one read from Redis does.

    orjson's output (:func:`~..message.dumps`, every event encoded) keeps the buffer it wrote
    into: 4 KiB for a small event, 1 MiB for one of 100 KB (some 10 times its length), which the
    recovery window and the topic histories would hold for as long as they keep the event.
    ``join`` of two parts always makes a new object of the exact size (some 60 ns)."""
    return b"".join((data, b""))


class MemoryBackplane(Backplane):
    """One instance, no Redis: a bounded in-process queue between the inbound and the sockets.

    Its history lives in this process only, so each backplane starts a new random epoch, and its
    positions are ``"{epoch}.{tag}.{n}"``, ``n`` counting from 1 (what orders them) and ``tag``
    12 random hex digits of each position's own: no position can be made from another (the
    recovery window knows each one it gave out exactly, and takes no other).
    """

    def __init__(self, max_pending: int = 10_000, max_reports: int = 100_000) -> None:
        self._max_pending = max_pending
        self._max_reports = max_reports
        self._reports: OrderedDict[str, Report] = OrderedDict()  # the one instance's, oldest first
        self._queue: asyncio.Queue[Entry | None] | None = None
        self._epoch = secrets.token_hex(6)
        self._origin = f"{self._epoch}.{secrets.token_hex(TAG_BYTES)}.0"
        self._count = 0
        self._asks: dict[str, tuple[list[bytes], asyncio.Event]] = {}
        self._claims: dict[str, set[str]] = {}
        self._leases: dict[str, tuple[str, float]] = {}  # key: owner, when the hold ends
        # Topic histories: each topic's last sequence, and what it keeps (sequence order)
        self._sequences: dict[str, int] = {}
        self._topics: dict[str, deque[Stored]] = {}
        # Idempotency keys taken (fingerprint, position, answer, when free again), oldest first
        self._keys: OrderedDict[str, tuple[str, str, str, float]] = OrderedDict()

    async def connect(self) -> None:
        # The bound is kept by publish(), so that disconnect() can always add the end marker.
        self._queue = asyncio.Queue()

    async def disconnect(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            queue.put_nowait(None)

    async def publish(self, data: bytes) -> str:
        return self._put([exact(data)])[0]

    async def publish_many(self, events: list[bytes], claim: Claim | None = None) -> list[str]:
        """All of ``events`` or none: refused while ``max_pending`` events wait, so that a batch
        may pass the bound by its own size at most."""
        self._taken(claim)
        positions = self._put([exact(data) for data in events])
        self._take(claim, positions)
        return positions

    def _taken(self, claim: Claim | None) -> None:
        """:class:`AlreadyAccepted` when ``claim``'s key was taken within its window."""
        if claim is None:
            return
        kept = self._keys.get(claim.key)
        if kept is not None and kept[3] > time.monotonic():
            raise AlreadyAccepted(*kept[:3])

    def _take(self, claim: Claim | None, positions: list[str]) -> None:
        if claim is None or not positions:
            return
        keys, now = self._keys, time.monotonic()
        keys.pop(claim.key, None)  # a key taken again after its window goes last
        keys[claim.key] = (claim.fingerprint, positions[-1], claim.answer, now + claim.window)
        if len(keys) % 64 == 0:  # now and then, those whose windows ended (in this order)
            while keys and next(iter(keys.values()))[3] <= now:
                keys.popitem(last=False)

    async def publish_retained(
        self, events: list[tuple[bytes, Retention | None]], claim: Claim | None = None
    ) -> list[tuple[str, int | None]]:
        self._taken(claim)
        self._check()
        now = time.time()
        datas: list[bytes] = []
        sequences: list[int | None] = []
        for data, retention in events:
            sequence = None
            if retention is not None:
                sequence = self._sequences.get(retention.topic, 0) + 1
                self._sequences[retention.topic] = sequence
                data = with_sequence(data, sequence)  # a new object, of its exact size
            else:
                data = exact(data)
            sequences.append(sequence)
            datas.append(data)
        positions = self._put(datas)
        for (_, retention), sequence, data, position in zip(
            events, sequences, datas, positions, strict=True
        ):
            if retention is None or sequence is None:
                continue
            kept = self._topics.get(retention.topic)
            if kept is None or kept.maxlen != retention.max_count:
                kept = self._topics[retention.topic] = deque(kept or (), retention.max_count)
            kept.append(Stored(sequence, data, now, position))
            while kept and kept[0].time < now - retention.max_age:
                kept.popleft()
        self._take(claim, positions)
        return list(zip(positions, sequences, strict=True))

    async def topic_bounds(self, topic: str) -> tuple[int, int] | None:
        kept = self._topics.get(topic)
        return (kept[0].sequence, kept[-1].sequence) if kept else None

    async def topic_read(self, topic: str, start: int, count: int) -> list[Stored]:
        kept = self._topics.get(topic)
        if not kept or count <= 0:
            return []
        first = max(0, start - kept[0].sequence)  # sequences are contiguous in a topic's history
        return [kept[index] for index in range(first, min(len(kept), first + count))]

    def _check(self) -> asyncio.Queue[Entry | None]:
        queue = self._queue
        if queue is None:
            raise BackplaneUnavailable("the gateway is not running")
        if queue.qsize() >= self._max_pending:
            raise BackplaneUnavailable(
                f"{self._max_pending} events are already waiting for delivery"
            )
        return queue

    def _put(self, events: list[bytes]) -> list[str]:
        """Queue ``events``, each of its exact size (:func:`exact`): the sockets' consumer, the
        recovery window and a topic's history hold the same object."""
        queue = self._check()
        positions = []
        tags = os.urandom(TAG_BYTES * len(events)).hex()  # one system call for a batch
        epoch, count, width = self._epoch, self._count, 2 * TAG_BYTES
        for at, data in enumerate(events):
            count += 1
            position = f"{epoch}.{tags[at * width : (at + 1) * width]}.{count}"
            queue.put_nowait(Entry(position, data))
            positions.append(position)
        self._count = count
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
        return self._origin

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

    async def hold(self, key: str, owner: str, ttl: float) -> bool:
        if self._queue is None:
            raise BackplaneUnavailable("the gateway is not running")
        now = time.monotonic()
        held = self._leases.get(key)
        if held is not None and held[0] != owner and held[1] > now:
            return False
        self._leases[key] = (owner, now + ttl)
        return True

    async def let_go(self, key: str, owner: str) -> None:
        held = self._leases.get(key)
        if held is not None and held[0] == owner:
            del self._leases[key]

    async def report(self, reports: list[Report]) -> None:
        """Kept until their ``until``, the oldest dropped past ``max_reports``."""
        kept, now = self._reports, time.time()
        for report in reports:
            kept[report.message_id] = report
        while kept and (len(kept) > self._max_reports or next(iter(kept.values())).until < now):
            kept.popitem(last=False)

    async def reports(self, message_id: str) -> tuple[dict[str, bytes], set[str]]:
        report = self._reports.get(message_id)
        if report is None or report.until < time.time():
            return {}, {LOCAL}
        return {LOCAL: report.data}, {LOCAL}
