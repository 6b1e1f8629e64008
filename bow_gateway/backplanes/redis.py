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

The reading is :mod:`.redis_reader`'s, the topic histories :mod:`.redis_topics`', the writing
:mod:`.redis_writer`'s.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..core.retention import Retention
from ..runtime.redis_client import RedisSettings, redis_client
from .base import Backplane, BackplaneUnavailable, Claim, Entry, Report
from .redis_ids import POSITION, Cursor, StreamId, as_text, format_id, parse_id, raw_reply
from .redis_instances import FAILURES, Instances
from .redis_reader import FIELD, Client, StreamReading, cause
from .redis_scripts import Scripts
from .redis_topics import TopicHistories
from .redis_writer import Out, StreamWriter


class RedisBackplane(StreamReading, TopicHistories, Backplane):
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
        self.live_for = live_for  # seconds an instance counts as live after its last heartbeat
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
            claim_prefix=f"{{{self.namespace}}}:key:",
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

    async def publish_many(self, events: list[bytes], claim: Claim | None = None) -> list[str]:
        """Every event's ``XADD`` in one script call (however many, however large), in order,
        within ``publish_timeout``; their positions, or :class:`BackplaneUnavailable` if any
        failed. A ``claim``'s key is ``{namespace}:key:{key}``, taken by the same call."""
        published = await self._publish([(data, None) for data in events], claim)
        return [position for position, _ in published]

    async def publish_retained(
        self, events: list[tuple[bytes, Retention | None]], claim: Claim | None = None
    ) -> list[tuple[str, int | None]]:
        """:meth:`publish_many`; a kept event's script also appends it to its topic's history,
        a stream ``{namespace}:topic:{topic}`` whose ids are ``{sequence}-{ms}``."""
        return await self._publish(list(events), claim)

    def _connected(self) -> Client:
        if self._client is None:
            raise BackplaneUnavailable("the gateway is not connected to Redis")
        return self._client

    async def _publish(
        self, events: list[Out], claim: Claim | None = None
    ) -> list[tuple[str, int | None]]:
        writer = self._writer
        if self._client is None or writer is None:
            raise BackplaneUnavailable("the gateway is not connected to Redis")
        if not events:
            return []
        try:
            positions = await writer.write(events, claim)
        except TimeoutError as exc:
            self._lost(exc, "writing to")
            raise BackplaneUnavailable(f"Redis did not take {_what(events)}: {exc}") from None
        except FAILURES as exc:
            self._lost(exc, "writing to")
            raise BackplaneUnavailable(f"Redis did not take {_what(events)}: {cause(exc)}") from exc
        self._healthy = True
        return positions

    async def backlog(self, count: int) -> list[Entry]:
        """The newest ``count`` entries up to where the stream ended at :meth:`connect`."""
        client, end = self._client, self._connected_at
        if client is None or count <= 0 or end.last == (0, 0):
            return []
        try:
            found: Any = await client.xrevrange(self.key, format_id(end.last), "-", count=count)
        except FAILURES as exc:
            raise BackplaneUnavailable(f"Redis did not give the backlog: {cause(exc)}") from exc
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

    async def report(self, reports: list[Report]) -> None:
        await self._joined().report(reports)

    async def reports(self, message_id: str) -> tuple[dict[str, bytes], set[str]]:
        return await self._joined().reports(message_id)

    async def let_go(self, key: str, owner: str) -> None:
        await self._joined().let_go(key, owner)

    def _joined(self) -> Instances:
        if self._instances is None:
            raise BackplaneUnavailable("the gateway is not connected to Redis")
        return self._instances

    # -- plumbing -----------------------------------------------------------------------------

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


def _what(events: list[Any]) -> str:
    return "the event" if len(events) == 1 else f"the {len(events)} events"
