"""The Redis backplane: one Redis Stream carries every event of a gateway, in one order.

Each event is one ``XADD`` (a single field, ``d``), the stream trimmed to about ``max_len``
entries; events published while a write is under way go together in the next one, in the order
they were published, and the events of one :meth:`~RedisBackplane.publish_many` always go in the
same write. A write is one call of a Lua script (:mod:`.redis_scripts`) that ``XADD``s its events
and first starts a new epoch when the stream or the epoch key is missing; a position is
``"{epoch}.{stream id}"``. Every instance reads the stream with ``XREAD BLOCK`` from the last id
it has read, so after a lost connection it resumes where it stopped: nothing published meanwhile
is skipped, and nothing is read twice. A failed publish is not retried, and it may still be
delivered: when the connection breaks after Redis applied it (a whole write fails, even the
events Redis took), or when Redis applies it after ``publish_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any, Final, TypeVar

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..core.retention import Retention
from ..runtime.redis_client import RedisSettings, describe, redis_client
from .base import (
    EPOCH_CHANGED,
    TRIMMED,
    Backplane,
    BackplaneUnavailable,
    Entry,
    Gap,
    Stored,
)
from .redis_ids import (
    POSITION,
    Cursor,
    Look,
    StreamId,
    as_text,
    format_id,
    id_before,
    parse_id,
    raw_reply,
    stream_entries,
)
from .redis_instances import FAILURES, Instances
from .redis_scripts import Scripts
from .redis_writer import Out, StreamWriter

RESYNC_INTERVAL: Final = 1.0
"""Seconds between two looks (``XINFO STREAM``) at a stream read without interruption."""

logger = logging.getLogger(__name__)

T = TypeVar("T")
Client = Redis | RedisCluster
FIELD = b"d"
POSITION_FIELD = b"p"  # a topic history's entry: where the event is in the stream
_FAILURES = FAILURES


class _Stopped(Exception):
    """:meth:`RedisBackplane.disconnect` was called: the reader ends."""


class RedisBackplane(Backplane):
    """Every instance of the gateway appends to, and reads, the same Redis Stream.

    ``redis``: the settings :func:`bow_gateway.runtime.redis_client.redis_client` takes (a URL, a
    dict of redis-py connection settings, Sentinel's, or a list of cluster nodes).
    """

    def __init__(
        self,
        redis: RedisSettings,
        *,
        namespace: str = "bow",
        max_len: int = 100_000,
        block_ms: int = 1000,
        batch: int = 500,
        batch_bytes: int = 1_048_576,
        connect_retries: int = 5,
        retry_backoff: float = 0.1,
        max_backoff: float = 5.0,
        publish_timeout: float = 2.0,
        heartbeat_interval: float = 1.0,
        live_for: float = 3.0,
    ) -> None:
        self.redis = redis
        self.namespace = namespace
        self.key = f"{{{namespace}}}:events"  # a hash tag, so that a cluster never splits it
        self.epoch_key = f"{{{namespace}}}:epoch"
        self.sequences_key = f"{{{namespace}}}:sequences"  # each topic's last sequence
        self.instance_id = secrets.token_hex(8)
        self._max_len = max_len
        self._block_ms = block_ms
        self._batch = batch
        self._batch_bytes = batch_bytes
        self._connect_retries = connect_retries
        self._retry_backoff = retry_backoff
        self._max_backoff = max_backoff
        self._publish_timeout = publish_timeout
        self._heartbeat = (heartbeat_interval, live_for)
        self._client: Client | None = None
        self._scripts: Scripts | None = None
        self._instances: Instances | None = None
        self._closers: list[Callable[[], Awaitable[Any]]] = []
        self._cursor = Cursor()
        self._connected_at = Cursor()  # where the history ended when connect() returned
        self._epoch_after: StreamId = (0, 0)  # the id after which that epoch's entries start
        self._healthy = False
        self._readers: set[asyncio.Task[Any]] = set()  # tasks inside a read disconnect() ends
        self._interrupted: set[asyncio.Task[Any]] = set()  # those disconnect() has cancelled
        self._writer: StreamWriter | None = None

    @property
    def ready(self) -> bool:
        return self._client is not None and self._healthy

    @property
    def epoch(self) -> str:
        """The epoch of what :meth:`events` yields now (a publish may see a newer one first)."""
        return self._cursor.epoch

    async def connect(self) -> None:
        """Reach Redis, retrying with capped exponential backoff, note where the stream ends and
        its epoch, and start heartbeating."""
        if self._client is not None:
            return
        client, closers = self._open()
        scripts = Scripts(client)
        try:
            self._cursor = await self._tail(client, scripts)
            # Every script at once: a pipeline mixing scripts must never find one loaded and
            # another not, or the calls sent again after loading would land after the others.
            await scripts.load_all()
        except BaseException:
            for close in closers:
                await close()
            raise
        self._connected_at = Cursor(self._cursor.last, self._cursor.seen, self._cursor.epoch)
        self._client, self._scripts, self._closers, self._healthy = client, scripts, closers, True
        self._writer = StreamWriter(
            scripts,
            key=self.key,
            epoch_key=self.epoch_key,
            sequences_key=self.sequences_key,
            topic_prefix=self.topic_key(""),
            max_len=self._max_len,
            batch=self._batch,
            batch_bytes=self._batch_bytes,
            publish_timeout=self._publish_timeout,
        )
        interval, live_for = self._heartbeat
        self._instances = Instances(
            client, scripts, self.namespace, self.instance_id, interval, live_for
        )
        await self._instances.start()

    async def disconnect(self) -> None:
        """Let publishes under way finish, interrupt the reads, stop heartbeating, close."""
        client, self._client = self._client, None
        if client is None:
            return
        self._healthy = False
        for task in self._readers:
            self._interrupted.add(task)
            task.cancel()
        instances, self._instances = self._instances, None
        try:
            if self._writer is not None:
                await self._writer.drain()
            if instances is not None:
                await instances.stop()
        finally:
            for close in self._closers:
                await close()

    async def publish(self, data: bytes) -> str:
        """``XADD`` within ``publish_timeout`` and return the position, or raise
        :class:`BackplaneUnavailable`; no retry."""
        return (await self._publish([(data, None)]))[0][0]

    async def publish_many(self, events: list[bytes]) -> list[str]:
        """Every event's ``XADD`` in one pipeline (however many, however large), in order, within
        ``publish_timeout``; their positions, or :class:`BackplaneUnavailable` if any failed."""
        return [position for position, _ in await self._publish([(data, None) for data in events])]

    async def publish_retained(
        self, events: list[tuple[bytes, Retention | None]]
    ) -> list[tuple[str, int | None]]:
        """:meth:`publish_many`; a kept event's script also appends it to its topic's history,
        a stream ``{namespace}:topic:{topic}`` whose ids are ``{sequence}-{ms}``."""
        return await self._publish(list(events))

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
        except _FAILURES as exc:
            raise BackplaneUnavailable(f"Redis did not answer: {_reason(exc)}") from exc
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
        except _FAILURES as exc:
            raise BackplaneUnavailable(f"Redis did not answer: {_reason(exc)}") from exc
        return [
            Stored(
                _sequence_of(entry_id),
                fields[FIELD],
                _ms_of(entry_id) / 1000,
                as_text(fields[POSITION_FIELD]),
            )
            for entry_id, fields in entries
        ]

    def _connected(self) -> Client:
        if self._client is None:
            raise BackplaneUnavailable("the gateway is not connected to Redis")
        return self._client

    async def _publish(self, events: list[Out]) -> list[tuple[str, int | None]]:
        writer = self._writer
        if self._client is None or writer is None:
            raise BackplaneUnavailable("the gateway is not connected to Redis")
        if not events:
            return []
        try:
            positions = await writer.write(events)
        except TimeoutError as exc:
            self._lost(exc, "writing to")
            raise BackplaneUnavailable(f"Redis did not take {_what(events)}: {exc}") from None
        except _FAILURES as exc:
            self._lost(exc, "writing to")
            raise BackplaneUnavailable(
                f"Redis did not take {_what(events)}: {_reason(exc)}"
            ) from exc
        self._healthy = True
        return positions

    async def events(self) -> AsyncIterator[Entry | Gap]:
        """Read on from the last id read (one reader at a time; a later call resumes there)."""
        client, cursor = self._client, self._cursor
        if client is None:
            return
        failures, check, checked = 0, True, 0.0
        while True:
            gap: Gap | None = None
            response: Any = None
            epoch: str | None = None
            try:
                if failures:  # Redis failed us: wait, then look at the stream before reading on
                    delay = self._delay(failures - 1)
                    await self._unless_stopped(client, partial(asyncio.sleep, delay))
                if check:
                    gap = await self._unless_stopped(client, partial(self._resync, client, cursor))
                    check, checked = False, time.monotonic()
                if gap is None:
                    read = partial(self._xread, client, cursor)
                    response, epoch = await self._unless_stopped(client, read)
            except _Stopped:
                return
            except _FAILURES as exc:
                self._lost(exc, "reading from")
                failures, check = failures + 1, True
                continue
            if failures:
                logger.info("reading %s from Redis again", self.key)
                failures = 0
            self._healthy = True
            if gap is not None:
                yield gap
                continue
            if epoch != cursor.epoch:  # a new history: what was read may belong to it
                check = True
                continue
            entries = stream_entries(response, FIELD)
            for entry_id, data in entries:
                cursor.last, cursor.seen = parse_id(entry_id), cursor.seen + 1
                if data is not None:
                    yield Entry(f"{epoch}.{as_text(entry_id)}", data)
            # Trimming can pass this reader only while it is behind (its batch came back full)
            # or slow (delivering took long), and each read checks the epoch; looking after every
            # batch would cost a round trip per message.
            check = len(entries) >= self._batch or time.monotonic() - checked >= RESYNC_INTERVAL

    async def backlog(self, count: int) -> list[Entry]:
        """The newest ``count`` entries up to where the stream ended at :meth:`connect`."""
        client, end = self._client, self._connected_at
        if client is None or count <= 0 or end.last == (0, 0):
            return []
        try:
            found: Any = await client.xrevrange(self.key, format_id(end.last), "-", count=count)
        except _FAILURES as exc:
            raise BackplaneUnavailable(f"Redis did not give the backlog: {_reason(exc)}") from exc
        return [
            Entry(f"{end.epoch}.{as_text(entry_id)}", fields[FIELD])
            for entry_id, fields in reversed(found)
            if FIELD in fields and parse_id(entry_id) > self._epoch_after
        ]

    def origin(self) -> str | None:
        epoch = self._connected_at.epoch
        return f"{epoch}.{format_id(self._epoch_after)}" if epoch else None

    def parse_position(self, position: str) -> tuple[str, tuple[int, ...]] | None:
        match = POSITION.fullmatch(position)
        if match is None or len(position) > 64:
            return None
        return match[1], (int(match[2]), int(match[3]))

    async def answer(self, request_id: str, data: bytes) -> None:
        await self._joined().answer(request_id, data)

    async def answers(
        self, request_id: str, publish: Callable[[], Awaitable[str]], timeout: float
    ) -> tuple[list[bytes], bool]:
        return await self._joined().answers(request_id, publish, timeout)

    async def claim(self, key: str, member: str, limit: int) -> bool:
        return await self._joined().claim(key, member, limit)

    async def release(self, key: str, member: str) -> None:
        await self._joined().release(key, member)

    async def hold(self, key: str, owner: str, ttl: float) -> bool:
        return await self._joined().hold(key, owner, ttl)

    async def let_go(self, key: str, owner: str) -> None:
        await self._joined().let_go(key, owner)

    def _joined(self) -> Instances:
        if self._instances is None:
            raise BackplaneUnavailable("the gateway is not connected to Redis")
        return self._instances

    # -- Redis commands -----------------------------------------------------------------------

    async def _xread(self, client: Client, cursor: Cursor) -> tuple[Any, str | None]:
        """``XREAD`` on from ``cursor``, then the epoch what it found belongs to: a ``GET`` sent
        with it, in one round trip, which Redis runs once the ``XREAD`` has returned."""
        pipeline = client.pipeline(transaction=False)
        pipeline.xread({self.key: format_id(cursor.last)}, count=self._batch, block=self._block_ms)
        pipeline.get(self.epoch_key)
        response, value = await pipeline.execute()
        if not response:
            return response, cursor.epoch
        return response, None if value is None else as_text(value).partition(" ")[0]

    async def _look(self, scripts: Scripts, replace: str = "") -> Look:
        """The epoch (a new one if it or the stream is missing, or if it is ``replace``) and the
        stream's state, in one atomic script."""
        value, last, added, first, length = await scripts.run(
            "look", [self.key, self.epoch_key], [secrets.token_hex(6), replace]
        )
        epoch, after, added_then = bytes(value).decode().split(" ")
        return Look(
            epoch,
            parse_id(after),
            int(added_then),
            parse_id(last),
            int(added) if added else None,
            parse_id(first) if first else None,
            int(length),
        )

    async def _tail(self, client: Client, scripts: Scripts) -> Cursor:
        """Where the stream ends now and its epoch, retried while Redis is unreachable."""
        attempt = 0
        while True:
            try:
                look = await self._look(scripts)
                break
            except _FAILURES as exc:
                where, reason = describe(self.redis), _reason(exc)
                if attempt >= self._connect_retries:
                    raise BackplaneUnavailable(
                        f"cannot reach Redis at {where} after {attempt + 1} attempts: {reason}"
                    ) from exc
                delay = self._delay(attempt)
                logger.warning(
                    "cannot reach Redis at %s (%s); trying again in %.1fs", where, reason, delay
                )
                await asyncio.sleep(delay)
                attempt += 1
        self._epoch_after = look.after
        return Cursor(look.last, look.added or 0, look.epoch)

    async def _resync(self, client: Client, cursor: Cursor) -> Gap | None:
        """Before reading on: notice a new epoch, a history gone backwards, or entries trimmed
        past ``cursor``; move ``cursor`` to where reading goes on, and say the gap."""
        assert self._scripts is not None
        look = await self._look(self._scripts)
        if look.epoch == cursor.epoch and (
            look.last < cursor.last or (look.added is not None and look.added < cursor.seen)
        ):  # the same epoch, a shorter history: a failover to a replica lacking entries
            look = await self._look(self._scripts, replace=cursor.epoch)
        if look.epoch != cursor.epoch:
            logger.warning(
                "the history on the Redis stream %s changed (Redis lost its data, was flushed,"
                " the stream deleted, or a failover went back): epoch %s, then %s; events this"
                " instance had not read by then are lost",
                self.key,
                cursor.epoch,
                look.epoch,
            )
            cursor.epoch, cursor.last, cursor.seen = look.epoch, look.after, look.added_then
            return Gap(f"{look.epoch}.{format_id(look.after)}", EPOCH_CHANGED)
        if look.added is None or look.first is None or look.first <= cursor.last:
            return None
        lost = look.added - cursor.seen - look.length
        if lost <= 0:
            return None
        logger.warning(
            "%d events were trimmed from the Redis stream %s before this instance could read them"
            " (max_len=%d)",
            lost,
            self.key,
            self._max_len,
        )
        cursor.seen += lost
        cursor.last = id_before(look.first)
        return Gap(f"{cursor.epoch}.{format_id(cursor.last)}", TRIMMED)

    # -- plumbing -----------------------------------------------------------------------------

    async def _unless_stopped(self, client: Client, start: Callable[[], Awaitable[T]]) -> T:
        """Await ``start()``; ``_Stopped`` if :meth:`disconnect` interrupts it (or came first)."""
        task = asyncio.current_task()
        if self._client is not client or task is None:
            raise _Stopped
        self._readers.add(task)
        cancelling = task.cancelling()
        try:
            result = await start()
        except asyncio.CancelledError:
            if task not in self._interrupted:  # not disconnect()'s
                raise
            self._interrupted.discard(task)
            if task.uncancel() > cancelling:  # someone else's as well
                raise
            raise _Stopped from None
        finally:
            self._readers.discard(task)
        if task in self._interrupted:
            # disconnect()'s cancellation, swallowed by redis-py: on CPython 3.11 the wait_for
            # around its socket writes drops one that comes after the write ended but before the
            # task resumed (bpo-42130), and the read goes on. It ends the reader all the same.
            self._interrupted.discard(task)
            task.uncancel()
            raise _Stopped
        return result

    def _open(self) -> tuple[Client, list[Callable[[], Awaitable[Any]]]]:
        """A client for the ``redis`` setting, and what closes it."""
        # This class reconnects and resumes by itself: redis-py retrying a command behind its back
        # would hide a lost connection (and could write an event twice). RESP2, because with
        # RESP3 redis-py 8 hands out pooled connections that Redis has closed, so the first
        # publishes after a Redis restart fail. The user's settings win, but events are bytes.
        own: dict[str, Any] = {
            "retry": Retry(NoBackoff(), 0),
            "protocol": 2,
            "socket_timeout": self._block_ms / 1000 + 5,  # XREAD BLOCK must not time out
        }
        client = redis_client(self.redis, defaults=own, decode_responses=False)
        client.set_response_callback("XREAD", raw_reply)  # this client's, read by stream_entries
        return client, [client.aclose]

    def _delay(self, attempt: int) -> float:
        """Capped exponential backoff."""
        return float(min(self._max_backoff, self._retry_backoff * 2**attempt))

    def _lost(self, exc: BaseException, doing: str) -> None:
        """Not ready until Redis answers again; logged once per outage."""
        if self._healthy:
            logger.warning("lost Redis while %s %s: %s; retrying", doing, self.key, _reason(exc))
        self._healthy = False


def _sequence_of(entry_id: Any) -> int:
    """A topic history's id ``{sequence}-{ms}``: the sequence."""
    return int(as_text(entry_id).partition("-")[0])


def _ms_of(entry_id: Any) -> int:
    return int(as_text(entry_id).partition("-")[2])


def _what(events: list[Any]) -> str:
    return "the event" if len(events) == 1 else f"the {len(events)} events"


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
