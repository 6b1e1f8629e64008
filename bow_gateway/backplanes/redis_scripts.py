"""The Lua scripts of the Redis backplane, and how it runs them (``EVALSHA``, pipelined).

Every script touches only keys of one namespace, which share the ``{namespace}`` hash tag, so a
Redis Cluster runs each on one node. The epoch key holds ``"{epoch} {after} {added}"``: the epoch,
the stream id after which its entries start, and the stream's ``entries-added`` at that id, so that
an instance that takes a new epoch knows where to read on from.
"""

from __future__ import annotations

from typing import Any, Final

from redis.exceptions import NoScriptError, ResponseError

# Sets a new epoch (ARGV[n]) starting after the stream's last id; creates the stream if missing.
_NEW_EPOCH: Final = """
local function new_epoch(stream, key, epoch, create)
  local after, added = '0-0', 0
  if redis.call('EXISTS', stream) == 1 then
    local info = redis.call('XINFO', 'STREAM', stream)
    for i = 1, #info, 2 do
      if info[i] == 'last-generated-id' then after = info[i + 1]
      elseif info[i] == 'entries-added' then added = info[i + 1] end
    end
  elseif create then
    redis.call('XGROUP', 'CREATE', stream, 'bow-epoch', '$', 'MKSTREAM')
    redis.call('XGROUP', 'DESTROY', stream, 'bow-epoch')
  end
  local value = epoch .. ' ' .. after .. ' ' .. added
  redis.call('SET', key, value)
  return value
end
"""

PUBLISH: Final = (
    _NEW_EPOCH
    + """
-- KEYS: stream, epoch key; ARGV: data, a new epoch, max length. Returns {epoch value, id}.
local value = redis.call('GET', KEYS[2])
if not value or redis.call('EXISTS', KEYS[1]) == 0 then
  value = new_epoch(KEYS[1], KEYS[2], ARGV[2], false)
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'd', ARGV[1])
return {value, id}
"""
)

RETAIN: Final = (
    _NEW_EPOCH
    + """
-- PUBLISH, the event also kept in its topic's history with the topic's next sequence.
-- KEYS: stream, epoch key, sequences (a hash: topic to its last), the topic's history (a
-- stream whose ids are "{sequence}-{ms}", fields d (the data) and p (its position)); ARGV: data,
-- a new epoch, max length, topic, max count, max age (ms). Both copies of the data carry the
-- sequence: {"q":N,...}.
-- Returns {epoch value, id, sequence}.
local value = redis.call('GET', KEYS[2])
if not value or redis.call('EXISTS', KEYS[1]) == 0 then
  value = new_epoch(KEYS[1], KEYS[2], ARGV[2], false)
end
local function ms_of(id) return tonumber(string.match(id, '-(%d+)$')) end
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local seq = redis.call('HINCRBY', KEYS[3], ARGV[4], 1)
if seq == 1 then  -- a new topic, or its sequence lost (the hash deleted) but not its history
  local last = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)[1]
  if last then
    seq = tonumber(string.match(last[1], '^(%d+)-')) + 1
    redis.call('HSET', KEYS[3], ARGV[4], seq)
    ms = math.max(ms, ms_of(last[1]))
  end
end
local data = '{"q":' .. string.format('%d', seq) .. ',' .. string.sub(ARGV[1], 2)
local entry = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'd', data)
local epoch = string.match(value, '^[^ ]*')
local id = string.format('%d-%d', seq, ms)
redis.call('XADD', KEYS[4], 'MAXLEN', ARGV[5], id, 'd', data, 'p', epoch .. '.' .. entry)
local cutoff = ms - tonumber(ARGV[6])
local oldest = seq % 16 == 0 and redis.call('XRANGE', KEYS[4], '-', '+', 'COUNT', 1)[1]
if oldest and ms_of(oldest[1]) < cutoff then  -- every 16th: drop the front past max age
  local front = redis.call('XRANGE', KEYS[4], '-', '+', 'COUNT', 100)
  local keep = string.format('%d-0', tonumber(string.match(front[#front][1], '^(%d+)-')) + 1)
  for _, entry in ipairs(front) do
    if ms_of(entry[1]) >= cutoff then keep = entry[1] break end
  end
  redis.call('XTRIM', KEYS[4], 'MINID', keep)
end
return {value, entry, seq}
"""
)

LOOK: Final = (
    _NEW_EPOCH
    + """
-- KEYS: stream, epoch key; ARGV: a new epoch, the epoch to replace ('' for none).
-- A missing epoch or stream, or an epoch equal to ARGV[2], gets the new epoch (compare-and-set).
-- Returns {epoch value, last-generated-id, entries-added, first entry id, length}.
local value = redis.call('GET', KEYS[2])
if not value or redis.call('EXISTS', KEYS[1]) == 0
   or (ARGV[2] ~= '' and string.sub(value, 1, #ARGV[2] + 1) == ARGV[2] .. ' ') then
  value = new_epoch(KEYS[1], KEYS[2], ARGV[1], true)
end
local out = {value, '0-0', '', '', 0}
local info = redis.call('XINFO', 'STREAM', KEYS[1])
for i = 1, #info, 2 do
  local name, v = info[i], info[i + 1]
  if name == 'last-generated-id' then out[2] = v
  elseif name == 'entries-added' then out[3] = tostring(v)
  elseif name == 'first-entry' and v then out[4] = v[1]
  elseif name == 'length' then out[5] = v end
end
return out
"""
)

HEARTBEAT: Final = """
-- KEYS: instances; ARGV: this instance, seconds an instance stays live. Drops the dead ones.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
return 1
"""

LIVE: Final = """
-- KEYS: instances; ARGV: seconds an instance stays live. Returns the live instances.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
return redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf')
"""

CLAIM: Final = """
-- KEYS: the claims of one key, instances; ARGV: instance:member, limit, seconds live.
-- Drops members of dead instances, then adds ARGV[1] unless the limit is reached (1: added).
local t = redis.call('TIME')
local oldest = tonumber(t[1]) + tonumber(t[2]) / 1e6 - tonumber(ARGV[3])
local live = {}
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local instance = string.match(member, '^[^:]*')
  if live[instance] == nil then
    local seen = redis.call('ZSCORE', KEYS[2], instance)
    live[instance] = seen ~= false and tonumber(seen) >= oldest
  end
  if not live[instance] then redis.call('ZREM', KEYS[1], member) end
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
local limit = tonumber(ARGV[2])
if limit > 0 and redis.call('ZCARD', KEYS[1]) >= limit then return 0 end
redis.call('ZADD', KEYS[1], t[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], 86400)  -- the claims of ids that never come back go in a day
return 1
"""


class Scripts:
    """The scripts' SHA1s, for ``EVALSHA`` in a pipeline; loaded again where Redis lacks them."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._registered = {
            name: client.register_script(source)
            for name, source in {
                "publish": PUBLISH,
                "retain": RETAIN,
                "look": LOOK,
                "heartbeat": HEARTBEAT,
                "live": LIVE,
                "claim": CLAIM,
            }.items()
        }

    def sha(self, name: str) -> str:
        sha: str = self._registered[name].sha
        return sha

    async def load_all(self) -> None:
        for name in self._registered:
            await self.load(name)

    async def load(self, name: str) -> None:
        """``SCRIPT LOAD`` (on every primary of a cluster)."""
        await self._client.script_load(self._registered[name].script)

    async def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """One script, loaded first if Redis lacks it (a restart empties its script cache)."""
        for attempt in (0, 1):
            try:
                return await self._client.evalsha(self.sha(name), len(keys), *keys, *args)
            except NoScriptError:
                if attempt:
                    raise
                await self.load(name)
        raise AssertionError("unreachable")

    async def pipelined(self, name: str, keys: list[str], calls: list[list[Any]]) -> list[Any]:
        """The script once per list of arguments in ``calls``, in one pipeline (:meth:`mixed`)."""
        return await self.mixed([(name, keys, args) for args in calls])

    async def mixed(self, calls: list[tuple[str, list[str], list[Any]]]) -> list[Any]:
        """Each ``(script, keys, arguments)`` in one pipeline, in order; a result is an
        exception where that call failed. Calls refused for lack of their script are loaded and
        sent again (they did not run)."""
        results: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in (0, 1):
            pipeline = self._client.pipeline(transaction=False)
            for n in todo:
                name, keys, args = calls[n]
                # execute_command: redis-py's cluster pipeline refuses its evalsha() method
                pipeline.execute_command("EVALSHA", self.sha(name), len(keys), *keys, *args)
            answers = await pipeline.execute(raise_on_error=False)
            missing = []
            for n, answer in zip(todo, answers, strict=True):
                results[n] = answer
                if isinstance(answer, ResponseError) and _no_script(answer):
                    missing.append(n)
            if not missing or attempt:
                break
            await self.load_all()  # Redis lost them all (a restart, SCRIPT FLUSH): all fail
            todo = missing
        return results


def _no_script(exc: ResponseError) -> bool:
    return isinstance(exc, NoScriptError) or str(exc).startswith("NOSCRIPT")
