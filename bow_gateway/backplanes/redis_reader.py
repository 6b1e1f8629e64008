"""The Redis backplane's reader: the stream read with ``XREAD BLOCK`` from the last id read, its
epoch looked at (``XINFO STREAM`` in the ``look`` script) before reading on after a failure, now
and then while reading, and whenever a batch comes back full: a new epoch or entries trimmed past
the reader are told as a :class:`~bow_gateway.backplanes.base.Gap`. A mixin of
:class:`~bow_gateway.backplanes.redis.RedisBackplane`, whose state it reads."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any, Final, TypeVar

from redis.asyncio import Redis, RedisCluster

from ..runtime.redis_client import RedisSettings, describe
from .base import EPOCH_CHANGED, TRIMMED, BackplaneUnavailable, Entry, Gap
from .redis_ids import (
    Cursor,
    Look,
    StreamId,
    as_text,
    format_id,
    id_before,
    parse_id,
    stream_entries,
)
from .redis_instances import FAILURES
from .redis_scripts import Scripts

RESYNC_INTERVAL: Final = 1.0
"""Seconds between two looks (``XINFO STREAM``) at a stream read without interruption."""

logger = logging.getLogger("bow_gateway.backplanes.redis")  # the backplane's, as its logs say

T = TypeVar("T")
Client = Redis | RedisCluster
FIELD = b"d"


class _Stopped(Exception):
    """:meth:`RedisBackplane.disconnect` was called: the reader ends."""


class StreamReading:
    """Reading the stream: :meth:`events`, and what it takes (the ``look`` script, ``XREAD``,
    backoff while Redis fails)."""

    redis: RedisSettings
    key: str
    epoch_key: str
    _max_len: int
    _block_ms: int
    _batch: int
    _connect_retries: int
    _retry_backoff: float
    _max_backoff: float
    _client: Client | None
    _scripts: Scripts | None
    _cursor: Cursor
    _epoch_after: StreamId
    _healthy: bool
    _readers: set[asyncio.Task[Any]]
    _interrupted: set[asyncio.Task[Any]]

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
            except FAILURES as exc:
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
            except FAILURES as exc:
                where, reason = describe(self.redis), cause(exc)
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

    def _delay(self, attempt: int) -> float:
        """Capped exponential backoff."""
        return float(min(self._max_backoff, self._retry_backoff * 2**attempt))

    def _lost(self, exc: BaseException, doing: str) -> None:
        """Not ready until Redis answers again; logged once per outage."""
        if self._healthy:
            logger.warning("lost Redis while %s %s: %s; retrying", doing, self.key, cause(exc))
        self._healthy = False


def cause(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
