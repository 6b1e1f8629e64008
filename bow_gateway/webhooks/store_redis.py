"""The webhook store of a gateway on Redis: every key under the backplane's ``{namespace}`` hash
tag (one Redis Cluster slot), so that one script may touch them all.

- ``{ns}:webhooks``: a Stream, one entry per event waiting, field ``e`` its stored JSON
  (``{"type", "data", "key", "at"}``, :meth:`~.events.WebhookEvent.stored`); a replayed entry
  also has ``w`` (the one webhook's tag) and ``i`` (its first webhook-id). Consumer group
  ``deliver``; an entry is ``XACK``ed and ``XDEL``eted once every webhook it goes to answered
  ``2xx`` or made it a dead letter, so ``XLEN`` is the backlog.
- ``{ns}:webhooks:overflow``: a Stream of the events refused at ``max_backlog`` (field ``e``),
  which the delivering instance turns into dead letters.
- ``{ns}:webhooks:dead``: a Stream of dead letters (field ``d``, JSON), ``MAXLEN max_dead``.
- ``{ns}:webhooks:done``: a hash, entry id to the tags delivered, for entries to several webhooks.
- ``{ns}:webhooks:lease``: the id of the one instance delivering, with a TTL it renews; when it
  dies the key expires and another takes over, claiming its pending entries (``XAUTOCLAIM``).

Another script appends an event atomically with its own change by pasting :data:`APPEND_LUA`
before its code and calling, with keys made by :func:`stream_keys`::

    bow_webhooks_append(stream_key, overflow_key, max_backlog, max_dead, event_json)

which ``XADD``s ``e`` = ``event_json`` to the stream (1), or to the overflow when ``max_backlog``
entries wait (0). Both keys must be passed in the script's ``KEYS``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any, Final

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError

from ..backplanes import BackplaneUnavailable
from ..backplanes.redis_instances import FAILURES
from ..runtime.redis_client import RedisSettings, redis_client
from .events import WebhookEvent, loaded
from .store import Finished, Stored, for_replay
from .store_scripts import APPEND_LUA, BURY, EMIT, FINISH, HOLD, RELEASE, REPLAY

__all__ = ["APPEND_LUA", "FIELD", "STREAM_SUFFIX", "RedisWebhookStore", "stream_keys"]

logger = logging.getLogger("bow_gateway.webhooks")

STREAM_SUFFIX: Final = ":webhooks"
OVERFLOW_SUFFIX: Final = ":webhooks:overflow"
FIELD: Final = "e"
GROUP: Final = "deliver"
BLOCK_MS: Final = 1_000


def stream_keys(namespace: str) -> tuple[str, str]:
    """The stream's key and the overflow's for ``namespace``."""
    return f"{{{namespace}}}{STREAM_SUFFIX}", f"{{{namespace}}}{OVERFLOW_SUFFIX}"


class RedisWebhookStore:
    """:class:`~.store.WebhookStore` in Redis (see the module): durable, shared by every
    instance of ``namespace``; the lease lasts ``lease_ttl`` s unless renewed."""

    def __init__(
        self,
        redis: RedisSettings,
        *,
        namespace: str = "bow",
        max_backlog: int = 100_000,
        max_dead: int = 10_000,
        lease_ttl: float = 10.0,
        write_timeout: float = 2.0,
    ) -> None:
        self.max_backlog = max_backlog
        self.max_dead = max_dead
        self.lease_ttl = lease_ttl
        self.namespace = namespace
        self.key, self.overflow_key = stream_keys(namespace)
        self.dead_key = f"{{{namespace}}}:webhooks:dead"
        self.done_key = f"{{{namespace}}}:webhooks:done"
        self.lease_key = f"{{{namespace}}}:webhooks:lease"
        self.consumer = secrets.token_hex(8)
        self._write_timeout = write_timeout
        self._held_until = 0.0  # monotonic: the lease surely ours until then
        self._claiming: str | None = None  # XAUTOCLAIM's cursor while taking the pending ones
        own: dict[str, Any] = {
            "retry": Retry(NoBackoff(), 0),  # a failed write is told, never repeated behind us
            "protocol": 2,
            "socket_timeout": BLOCK_MS / 1000 + 5,  # a blocking read must not time out
        }
        self._client: Any = redis_client(redis, defaults=own, decode_responses=False)
        self._scripts = {
            name: self._client.register_script(
                f"{APPEND_LUA}\n{source}" if name == "emit" else source
            )
            for name, source in (
                ("emit", EMIT),
                ("finish", FINISH),
                ("hold", HOLD),
                ("release", RELEASE),
                ("bury", BURY),
                ("replay", REPLAY),
            )
        }

    @property
    def client(self) -> Any:
        """The store's Redis client (another script may append events through it)."""
        return self._client

    async def _write(self, what: str, name: str, keys: list[str], args: list[Any]) -> Any:
        """Script ``name`` within the write timeout, or ``BackplaneUnavailable``."""
        try:
            async with asyncio.timeout(self._write_timeout):
                return await self._scripts[name](keys=keys, args=args)
        except FAILURES as error:
            raise BackplaneUnavailable(f"Redis did not take {what}: {error}") from error

    async def append(self, events: Sequence[WebhookEvent]) -> int:
        if not events:
            return 0
        args = [self.max_backlog, self.max_dead, *(event.stored() for event in events)]
        stored: int = await self._write(
            "the webhook events", "emit", [self.key, self.overflow_key], args
        )
        return stored

    async def hold(self) -> bool:
        ttl_ms = int(self.lease_ttl * 1000)
        started = time.monotonic()
        try:
            held = await self._scripts["hold"](keys=[self.lease_key], args=[self.consumer, ttl_ms])
        except FAILURES as error:
            logger.warning("could not renew the webhooks' lease: %s", error)
            return started < self._held_until  # still ours unless it may have lapsed
        if held:
            self._held_until = started + self.lease_ttl * 0.8
        return bool(held)

    async def release(self) -> None:
        self._held_until = 0.0
        try:
            await self._scripts["release"](keys=[self.lease_key], args=[self.consumer])
        except FAILURES as error:  # it lapses by itself
            logger.warning("could not give the webhooks' lease up: %s", error)

    async def begin(self) -> None:
        try:
            await self._client.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise BackplaneUnavailable(f"Redis refused the consumer group: {error}") from error
        except FAILURES as error:
            raise BackplaneUnavailable(f"Redis did not make the consumer group: {error}") from error
        self._claiming = "0-0"

    async def take(self, limit: int, timeout: float) -> list[Stored]:
        try:
            return await self._take(limit, timeout)
        except FAILURES as error:
            raise BackplaneUnavailable(f"Redis did not give the webhook events: {error}") from error

    async def _take(self, limit: int, timeout: float) -> list[Stored]:
        if self._claiming is not None:
            reply = await self._client.xautoclaim(
                self.key, GROUP, self.consumer, 0, start_id=self._claiming, count=limit
            )
            cursor, entries = reply[0], reply[1]
            gone = reply[2] if len(reply) > 2 else []
            if gone:  # deleted while pending: nothing to deliver
                await self._client.xack(self.key, GROUP, *gone)
            self._claiming = None if cursor in (b"0-0", "0-0") else cursor
            if entries or self._claiming is not None:
                return await self._stored(entries)
        block = max(1, min(BLOCK_MS, int(timeout * 1000)))
        reply = await self._client.xreadgroup(
            GROUP, self.consumer, {self.key: ">"}, count=limit, block=block
        )
        return await self._stored(reply[0][1] if reply else [])

    async def _stored(self, entries: list[Any]) -> list[Stored]:
        """The entries read, with the tags each was delivered to already; unreadable ones gone."""
        found: list[tuple[str, dict[bytes, bytes]]] = [
            (_text(entry_id), fields) for entry_id, fields in entries if fields
        ]
        if not found:
            return []
        done = await self._client.hmget(self.done_key, [entry_id for entry_id, _ in found])
        stored, bad = [], []
        for (entry_id, fields), tags in zip(found, done, strict=True):
            try:
                event = loaded(fields[FIELD.encode()])
            except (KeyError, ValueError) as error:
                logger.warning("webhook entry %s is unreadable, dropped: %s", entry_id, error)
                bad.append(entry_id)
                continue
            stored.append(
                Stored(
                    entry_id,
                    event,
                    _text(fields.get(b"w", b"")),
                    _text(fields.get(b"i", b"")),
                    frozenset(_text(tags).split(",")) - {""} if tags else frozenset(),
                )
            )
        if bad:
            await self.finish([Finished(entry_id, "", 1) for entry_id in bad])
        return stored

    async def finish(self, finished: Sequence[Finished]) -> None:
        if not finished:
            return
        args: list[Any] = [GROUP, self.max_dead]
        for item in finished:
            args += [item.entry, item.tag, item.targets, item.letter or b""]
        keys = [self.key, self.done_key, self.dead_key]
        await self._write("the webhook deliveries", "finish", keys, args)

    async def overflowed(self, limit: int) -> list[Stored]:
        try:
            entries = await self._client.xrange(self.overflow_key, "-", "+", count=limit)
            found = []
            for entry_id, fields in entries:
                try:
                    found.append(Stored(_text(entry_id), loaded(fields[FIELD.encode()])))
                except (KeyError, ValueError):
                    await self._client.xdel(self.overflow_key, entry_id)
        except FAILURES as error:
            raise BackplaneUnavailable(f"Redis did not give the overflow: {error}") from error
        return found

    async def bury(self, ids: Sequence[str], letters: Sequence[bytes]) -> None:
        args = [self.max_dead, len(letters), *letters, *ids]
        await self._write("the dead letters", "bury", [self.overflow_key, self.dead_key], args)

    async def dead(self, limit: int) -> list[bytes]:
        try:
            entries = await self._client.xrange(self.dead_key, "-", "+", count=limit)
        except FAILURES as error:
            raise BackplaneUnavailable(f"Redis did not give the dead letters: {error}") from error
        return [fields[b"d"] for _, fields in entries if b"d" in fields]

    async def replay(self, webhook_ids: Sequence[str]) -> int:
        wanted = set(webhook_ids)
        args: list[Any] = [self.max_backlog]
        start = "-"
        try:
            while wanted:
                entries = await self._client.xrange(self.dead_key, start, "+", count=1_000)
                for entry_id, fields in entries:
                    webhook_id, tag, event = for_replay(fields[b"d"])
                    if webhook_id in wanted:
                        wanted.discard(webhook_id)
                        args += [entry_id, event, tag, webhook_id]
                if len(entries) < 1_000:
                    break
                start = "(" + _text(entries[-1][0])
        except FAILURES as error:
            raise BackplaneUnavailable(f"Redis did not give the dead letters: {error}") from error
        if len(args) == 1:
            return 0
        replayed: int = await self._write("the replay", "replay", [self.key, self.dead_key], args)
        return replayed

    async def depth(self) -> int:
        try:
            length: int = await self._client.xlen(self.key)
        except FAILURES as error:
            raise BackplaneUnavailable(f"Redis did not give the backlog: {error}") from error
        return length

    async def close(self) -> None:
        await self._client.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
