"""``listener.online`` and ``listener.offline`` (contract section 19): an id's first authenticated
socket anywhere makes it online; its last one gone, and none back within ``offline_grace``
seconds, makes it offline. For one id the two alternate, in order, across instances.

The outbound tells :class:`Online` of each socket that took an id and each that went; they are
applied in that order by one task, in batches. :class:`MemoryOnline` keeps the state in this
process; :class:`RedisOnline` in Redis, where each change and its event are one script (the
event stored with the change, :data:`~.store_scripts.APPEND_LUA`), and a sweep that any instance
runs ends the grace of ids and takes the sockets of dead instances away.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import orjson

from ..core.criteria import ListenerId
from ..core.message import id_text
from ..runtime.ratelimit import rate_limited
from .events import WebhookEvent
from .store_redis import APPEND_LUA, stream_keys

logger = logging.getLogger("bow_gateway.webhooks")
warnings = rate_limited("bow_gateway.webhooks.online")

ONLINE: Final = "listener.online"
OFFLINE: Final = "listener.offline"
Change = tuple[bool, str, str, str]  # arrived (or left), the id's JSON text, socket, protocol
Emit = Callable[[Sequence[WebhookEvent]], Awaitable[None]]


class Online(abc.ABC):
    """Sockets taking an id and going, applied in order by :meth:`run` (at most
    ``max_pending`` waiting: past it a change is dropped with a warning, and the id's state may
    be wrong until its sockets change again)."""

    def __init__(self, *, grace: float = 5.0, max_pending: int = 100_000, every: float = 0.5):
        self.grace = grace
        self._every = every
        self._max_pending = max_pending
        self._changes: deque[Change] = deque()
        self._wake = asyncio.Event()

    def arrived(self, listener_id: ListenerId, sid: str, protocol: str) -> None:
        """A socket of ``listener_id`` was admitted (authenticated) on this instance."""
        self._note((True, id_text(listener_id), sid, protocol))

    def left(self, listener_id: ListenerId, sid: str) -> None:
        """A socket :meth:`arrived` before is gone."""
        self._note((False, id_text(listener_id), sid, ""))

    def _note(self, change: Change) -> None:
        if len(self._changes) >= self._max_pending:
            text = "%d socket changes wait for online/offline: one dropped"
            warnings.warning(text, len(self._changes))
            return
        self._changes.append(change)
        self._wake.set()

    async def run(self) -> None:
        """Forever: the changes noted, in order, in batches; the sweep every ``every`` s."""
        due = 0.0
        while True:
            try:
                async with asyncio.timeout(self._every):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            while self._changes:
                batch = [self._changes.popleft() for _ in range(min(500, len(self._changes)))]
                try:
                    await self._apply(batch)
                except Exception as error:  # noqa: BLE001 - kept, in order, for the next try
                    self._changes.extendleft(reversed(batch))
                    warnings.warning("online/offline changes wait: %s", error)
                    await asyncio.sleep(self._every)
                    break
            if time.monotonic() >= due:
                due = time.monotonic() + self._every
                try:
                    await self._sweep()
                except Exception as error:  # noqa: BLE001 - the next sweep tries again
                    warnings.warning("the online/offline sweep failed: %s", error)

    async def flush(self, timeout: float = 10.0) -> None:
        """Apply what waits now (a stopping instance's last sockets), within ``timeout`` s."""
        changes = list(self._changes)
        self._changes.clear()
        if not changes:
            return
        try:
            async with asyncio.timeout(timeout):
                await self._apply(changes)
        except Exception as error:  # noqa: BLE001 - the sweep of another instance will tell
            logger.warning("%d socket changes not applied at stop: %s", len(changes), error)

    @abc.abstractmethod
    async def _apply(self, changes: list[Change]) -> None:
        """Apply ``changes`` in order."""

    @abc.abstractmethod
    async def _sweep(self) -> None:
        """End the grace of ids whose time is up (and forget dead instances' sockets)."""


class MemoryOnline(Online):
    """One instance: the state in this process, events through ``emit``."""

    def __init__(self, emit: Emit, **options: Any) -> None:
        super().__init__(**options)
        self._emit = emit
        self._sockets: dict[str, set[str]] = {}
        self._leaving: dict[str, float] = {}  # id text: when it goes offline (monotonic)

    async def _apply(self, changes: list[Change]) -> None:
        events = []
        for arrived, text, sid, protocol in changes:
            sockets = self._sockets.setdefault(text, set())
            if arrived:
                sockets.add(sid)
                if self._leaving.pop(text, None) is None and len(sockets) == 1:
                    events.append(_event(ONLINE, text, protocol))
            else:
                sockets.discard(sid)
                if not sockets:
                    self._leaving[text] = time.monotonic() + self.grace
        if events:
            await self._emit(events)

    async def _sweep(self) -> None:
        now = time.monotonic()
        gone = [text for text, at in self._leaving.items() if at <= now]
        for text in gone:
            del self._leaving[text]
            if not self._sockets.get(text):
                self._sockets.pop(text, None)
        if gone:
            await self._emit([_event(OFFLINE, text) for text in gone])


def _event(kind: str, text: str, protocol: str = "") -> WebhookEvent:
    listener_id = _loaded_id(text)
    data: dict[str, Any] = {"id": listener_id}
    if kind == ONLINE:
        data["protocol"] = protocol
    return WebhookEvent(kind, data, key=text)


def _loaded_id(text: str) -> ListenerId:
    value: ListenerId = orjson.loads(text)
    return value


# Keys (all under the namespace's hash tag): {ns}:online:state (hash: id text -> "on" or
# "leaving"), {ns}:online:leaving (zset: id text by when it goes offline, ms), {ns}:online:s:<id
# text> (set of "instance socket" members), {ns}:online:by:<instance> (set of id texts).
_ARRIVE = (
    APPEND_LUA
    + """
-- KEYS: state, leaving, sockets, by, stream, overflow, holders
-- ARGV: id text, member, max_backlog, max_dead, event json, instance. 1: went online.
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('SADD', KEYS[7], ARGV[6])
local state = redis.call('HGET', KEYS[1], ARGV[1])
if state == 'on' then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], 'on')
if state == 'leaving' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
bow_webhooks_append(KEYS[5], KEYS[6], ARGV[3], ARGV[4], ARGV[5])
return 1
"""
)

_LEAVE = """
-- KEYS: state, leaving, sockets, by; ARGV: id text, member, grace in ms, instance. 1: leaving.
redis.call('SREM', KEYS[3], ARGV[2])
local mine = false
for _, member in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if string.sub(member, 1, string.len(ARGV[4]) + 1) == ARGV[4] .. ' ' then mine = true end
end
if not mine then redis.call('SREM', KEYS[4], ARGV[1]) end  -- by: this instance's ids, bounded
if redis.call('SCARD', KEYS[3]) > 0 or redis.call('HGET', KEYS[1], ARGV[1]) ~= 'on' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], 'leaving')
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
return 1
"""

_SWEEP = (
    APPEND_LUA
    + """
-- KEYS: state, leaving, instances, stream, overflow, holders (the instances that have held
-- sockets); ARGV: prefix, max_backlog, max_dead,
-- seconds an instance stays live, grace in ms. Forgets the sockets of dead instances (their ids
-- leave), then ends the grace of ids whose time is up (offline). Returns the offline count.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local oldest = now / 1000 - tonumber(ARGV[4])
local prefix = ARGV[1]
for _, instance in ipairs(redis.call('SMEMBERS', KEYS[6])) do
  local key = prefix .. 'by:' .. instance
  local seen = redis.call('ZSCORE', KEYS[3], instance)
  if not seen or tonumber(seen) < oldest then
    for _, text in ipairs(redis.call('SMEMBERS', key)) do
      local sockets = prefix .. 's:' .. text
      for _, member in ipairs(redis.call('SMEMBERS', sockets)) do
        if string.sub(member, 1, string.len(instance) + 1) == instance .. ' ' then
          redis.call('SREM', sockets, member)
        end
      end
      if redis.call('SCARD', sockets) == 0 and redis.call('HGET', KEYS[1], text) == 'on' then
        redis.call('HSET', KEYS[1], text, 'leaving')
        redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), text)
      end
    end
    redis.call('DEL', key)
    redis.call('SREM', KEYS[6], instance)
  end
end
local offline = 0
for _, text in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1000)) do
  redis.call('ZREM', KEYS[2], text)
  if redis.call('HGET', KEYS[1], text) == 'leaving' then
    redis.call('HDEL', KEYS[1], text)
    local event = '{"type":"listener.offline","data":{"id":' .. text .. '},"key":'
      .. cjson.encode(text) .. ',"at":' .. string.format('%.3f', now / 1000) .. '}'
    offline = offline + bow_webhooks_append(KEYS[4], KEYS[5], ARGV[2], ARGV[3], event)
  end
end
return offline
"""
)


class RedisOnline(Online):
    """Many instances: the state in Redis (``client``, the keys of ``namespace``), this one
    ``instance``; ``instances_key`` and ``live_for`` tell the live ones (the backplane's
    heartbeats); an event past ``max_backlog`` goes to the dead letters as any other."""

    def __init__(
        self,
        client: Any,
        namespace: str,
        instance: str,
        *,
        instances_key: str,
        live_for: float = 3.0,
        max_backlog: int = 100_000,
        max_dead: int = 10_000,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self._client = client
        self._prefix = f"{{{namespace}}}:online:"
        self._instance = instance
        self._instances = instances_key
        self._live_for = live_for
        self._stream, self._overflow = stream_keys(namespace)
        self._limits = (max_backlog, max_dead)
        self._arrive = client.register_script(_ARRIVE)
        self._leave = client.register_script(_LEAVE)
        self._sweeper = client.register_script(_SWEEP)

    async def _apply(self, changes: list[Change]) -> None:
        prefix, state, leaving = self._prefix, self._prefix + "state", self._prefix + "leaving"
        by, holders = f"{prefix}by:{self._instance}", prefix + "holders"
        grace_ms = max(1, round(self.grace * 1000))
        pipeline = self._client.pipeline(transaction=False)
        for arrived, text, sid, protocol in changes:
            member = f"{self._instance} {sid}"
            sockets = f"{prefix}s:{text}"
            if arrived:
                keys = [state, leaving, sockets, by, self._stream, self._overflow, holders]
                event = _event(ONLINE, text, protocol).stored()
                args = [text, member, *self._limits, event, self._instance]
                await self._arrive(keys, args, client=pipeline)
            else:
                args = [text, member, grace_ms, self._instance]
                await self._leave([state, leaving, sockets, by], args, client=pipeline)
        await pipeline.execute()

    async def _sweep(self) -> None:
        keys = [
            self._prefix + "state",
            self._prefix + "leaving",
            self._instances,
            self._stream,
            self._overflow,
            self._prefix + "holders",
        ]
        grace_ms = max(1, round(self.grace * 1000))
        args = [self._prefix, *self._limits, self._live_for, grace_ms]
        await self._sweeper(keys, args)
