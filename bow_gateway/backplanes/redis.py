"""The Redis backplane: one Redis Stream carries every event of a gateway, in one order.

Each event is one ``XADD`` (a single field, ``d``), the stream trimmed to about ``max_len``
entries; events published while an ``XADD`` is under way go together in one pipeline, in the
order they were published. Every instance reads the stream with ``XREAD BLOCK`` from the last id
it has read, so after a lost connection it resumes where it stopped: nothing published meanwhile
is skipped, and nothing is read twice. A failed publish is not retried, and it may still be
delivered: when the connection breaks after Redis applied it (a whole pipeline fails, even the
events Redis took), or when Redis applies it after ``publish_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, TypeVar

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from ..redis_client import RedisSettings, describe, redis_client
from .base import Backplane, BackplaneUnavailable

RESYNC_INTERVAL: Final = 1.0
"""Seconds between two looks (``XINFO STREAM``) at a stream read without interruption."""

logger = logging.getLogger(__name__)

T = TypeVar("T")
Client = Redis | RedisCluster
StreamId = tuple[int, int]
FIELD = b"d"
_FAILURES = (RedisError, RedisClusterException, OSError, TimeoutError)


class _Stopped(Exception):
    """:meth:`RedisBackplane.disconnect` was called: the reader ends."""


@dataclass
class _Cursor:
    """How far a reader has read: the last id, and how many entries the stream had added by then."""

    last: StreamId = (0, 0)
    seen: int = 0


class RedisBackplane(Backplane):
    """Every instance of the gateway appends to, and reads, the same Redis Stream.

    ``redis``: the settings :func:`bow_gateway.redis_client.redis_client` takes (a URL, a dict of
    redis-py connection settings, Sentinel's, or a list of cluster nodes).
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
    ) -> None:
        self.redis = redis
        self.key = f"{{{namespace}}}:events"  # a hash tag, so that a cluster never splits it
        self._max_len = max_len
        self._block_ms = block_ms
        self._batch = batch
        self._batch_bytes = batch_bytes
        self._connect_retries = connect_retries
        self._retry_backoff = retry_backoff
        self._max_backoff = max_backoff
        self._publish_timeout = publish_timeout
        self._trim: dict[str, Any] = {"maxlen": max_len, "approximate": True}
        self._client: Client | None = None
        self._closers: list[Callable[[], Awaitable[Any]]] = []
        self._cursor = _Cursor()
        self._healthy = False
        self._readers: set[asyncio.Task[Any]] = set()  # tasks inside a read disconnect() ends
        self._interrupted: set[asyncio.Task[Any]] = set()  # those disconnect() has cancelled
        self._pending: list[tuple[bytes, asyncio.Future[None]]] = []  # published, not yet sent
        self._writer: asyncio.Task[None] | None = None  # sends the pending events, then ends

    @property
    def ready(self) -> bool:
        return self._client is not None and self._healthy

    async def connect(self) -> None:
        """Reach Redis, retrying with capped exponential backoff, and note where the stream ends."""
        if self._client is not None:
            return
        client, closers = self._open()
        try:
            self._cursor = await self._tail(client)
        except BaseException:
            for close in closers:
                await close()
            raise
        self._client, self._closers, self._healthy = client, closers, True

    async def disconnect(self) -> None:
        """Let publishes under way finish, interrupt the reads, close the connections."""
        client, self._client = self._client, None
        if client is None:
            return
        self._healthy = False
        for task in self._readers:
            self._interrupted.add(task)
            task.cancel()
        try:
            if self._writer is not None:
                await asyncio.wait({self._writer})
        finally:
            for close in self._closers:
                await close()

    async def publish(self, data: bytes) -> None:
        """``XADD`` within ``publish_timeout``, or raise :class:`BackplaneUnavailable`; no retry."""
        client = self._client
        if client is None:
            raise BackplaneUnavailable("the gateway is not connected to Redis")
        written = asyncio.get_running_loop().create_future()
        self._pending.append((data, written))
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write(client))
        try:
            async with asyncio.timeout(self._publish_timeout):
                await written  # on a timeout, cancelled: the writer then skips it if unsent
        except TimeoutError:
            exc = TimeoutError(f"no answer within {self._publish_timeout}s")
            self._lost(exc, "writing to")
            raise BackplaneUnavailable(f"Redis did not take the event: {exc}") from None
        except _FAILURES as exc:
            self._lost(exc, "writing to")
            raise BackplaneUnavailable(f"Redis did not take the event: {_reason(exc)}") from exc
        self._healthy = True

    async def events(self) -> AsyncIterator[bytes]:
        """Read on from the last id read (one reader at a time; a later call resumes there)."""
        client, cursor = self._client, self._cursor
        if client is None:
            return
        failures, check, checked = 0, True, 0.0
        while True:
            try:
                if failures:  # Redis failed us: wait, then look at the stream before reading on
                    delay = self._delay(failures - 1)
                    await self._unless_stopped(client, partial(asyncio.sleep, delay))
                if check:
                    await self._unless_stopped(client, partial(self._resync, client, cursor))
                    checked = time.monotonic()
                response = await self._unless_stopped(client, partial(self._xread, client, cursor))
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
            entries = _entries(response)
            for entry_id, fields in entries:
                cursor.last, cursor.seen = _parse(entry_id), cursor.seen + 1
                if FIELD in fields:
                    yield fields[FIELD]
            # Trimming can pass this reader only while it is behind (its batch came back full)
            # or slow (delivering took long), and a stream reset without a lost connection (a
            # DEL) shows at the next periodic look; looking after every batch would cost a
            # round trip per message.
            check = len(entries) >= self._batch or time.monotonic() - checked >= RESYNC_INTERVAL

    # -- Redis commands -----------------------------------------------------------------------

    async def _write(self, client: Client) -> None:
        """Send the pending events, a pipeline at a time, until none is left."""
        batch: list[tuple[bytes, asyncio.Future[None]]] = []
        try:
            while self._pending:
                batch = self._next_batch()
                if not batch:  # every publisher of these gave up
                    continue
                try:
                    async with asyncio.timeout(self._publish_timeout):
                        results = await self._xadd(client, [data for data, _ in batch])
                except TimeoutError:
                    late = TimeoutError(f"no answer within {self._publish_timeout}s")
                    results = [late] * len(batch)
                except Exception as exc:  # noqa: BLE001 - each publisher raises it
                    results = [exc] * len(batch)
                for (_, written), result in zip(batch, results, strict=True):
                    if written.done():
                        continue
                    if isinstance(result, Exception):
                        written.set_exception(result)
                    else:
                        written.set_result(None)
        finally:
            self._writer = None
            for _, written in [*batch, *self._pending]:  # cancelled midway: no one will send them
                if not written.done():
                    written.set_exception(OSError("the writer was stopped"))

    def _next_batch(self) -> list[tuple[bytes, asyncio.Future[None]]]:
        """The oldest pending events still awaited, within ``batch`` events and ``batch_bytes``."""
        batch: list[tuple[bytes, asyncio.Future[None]]] = []
        size = taken = 0
        for data, written in self._pending:
            if batch and (len(batch) == self._batch or size + len(data) > self._batch_bytes):
                break
            taken += 1
            if not written.done():  # else its publisher gave up: not sent
                batch.append((data, written))
                size += len(data)
        del self._pending[:taken]
        return batch

    async def _xadd(self, client: Client, events: list[bytes]) -> list[Any]:
        """``XADD`` each event: one command alone (cheaper), else a pipeline."""
        if len(events) == 1:
            return [await client.xadd(self.key, {FIELD: events[0]}, **self._trim)]
        pipeline = client.pipeline(transaction=False)
        for data in events:
            pipeline.xadd(self.key, {FIELD: data}, **self._trim)
        return list(await pipeline.execute(raise_on_error=False))

    async def _xread(self, client: Client, cursor: _Cursor) -> Any:
        last = f"{cursor.last[0]}-{cursor.last[1]}"
        return await client.xread({self.key: last}, count=self._batch, block=self._block_ms)

    async def _info(self, client: Client) -> dict[str, Any] | None:
        """``XINFO STREAM`` of the events stream, or ``None`` while it does not exist."""
        try:
            info: dict[str, Any] = await client.xinfo_stream(self.key)
        except ResponseError as exc:
            if "no such key" in str(exc).lower():
                return None
            raise
        return info

    async def _tail(self, client: Client) -> _Cursor:
        """Where the stream ends now, retried while Redis is unreachable."""
        attempt = 0
        while True:
            try:
                info = await self._info(client)
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
        if info is None:
            return _Cursor()
        return _Cursor(_parse(info["last-generated-id"]), info.get("entries-added") or 0)

    async def _resync(self, client: Client, cursor: _Cursor) -> None:
        """Before reading on: notice a stream that was reset, or trimmed past ``cursor``."""
        info = await self._info(client)
        added = info.get("entries-added") if info else 0
        if (
            info is None
            or _parse(info["last-generated-id"]) < cursor.last
            or (added is not None and added < cursor.seen)
        ):
            if cursor != _Cursor():
                logger.warning(
                    "the Redis stream %s was reset (Redis restarted without persistence?): reading"
                    " it from its start; events this instance had not read by then are lost",
                    self.key,
                )
            cursor.last, cursor.seen = (0, 0), 0
            return
        first = info["first-entry"]
        if added is not None and first is not None and _parse(first[0]) > cursor.last:
            lost = added - cursor.seen - info["length"]
            if lost > 0:
                logger.warning(
                    "%d events were trimmed from the Redis stream %s before this instance could "
                    "read them (max_len=%d)",
                    lost,
                    self.key,
                    self._max_len,
                )
                cursor.seen += lost

    # -- plumbing -----------------------------------------------------------------------------

    async def _unless_stopped(self, client: Client, start: Callable[[], Awaitable[T]]) -> T:
        """Await ``start()``; ``_Stopped`` if :meth:`disconnect` interrupts it (or came first)."""
        task = asyncio.current_task()
        if self._client is not client or task is None:
            raise _Stopped
        self._readers.add(task)
        cancelling = task.cancelling()
        try:
            return await start()
        except asyncio.CancelledError:
            if task not in self._interrupted:  # not disconnect()'s
                raise
            self._interrupted.discard(task)
            if task.uncancel() > cancelling:  # someone else's as well
                raise
            raise _Stopped from None
        finally:
            self._readers.discard(task)

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
        return client, [client.aclose]

    def _delay(self, attempt: int) -> float:
        """Capped exponential backoff."""
        return float(min(self._max_backoff, self._retry_backoff * 2**attempt))

    def _lost(self, exc: BaseException, doing: str) -> None:
        """Not ready until Redis answers again; logged once per outage."""
        if self._healthy:
            logger.warning("lost Redis while %s %s: %s; retrying", doing, self.key, _reason(exc))
        self._healthy = False


def _entries(response: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The ``(id, fields)`` entries of an XREAD on one stream, whatever shape redis-py chose."""
    if not response:
        return []
    (entries,) = response.values() if isinstance(response, dict) else [s[1] for s in response]
    if entries and isinstance(entries[0], list):  # RESP3 with legacy_responses: one level more
        (entries,) = entries
    return list(entries)


def _parse(entry_id: bytes | str) -> StreamId:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    milliseconds, _, sequence = text.partition("-")
    return int(milliseconds), int(sequence or 0)


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
