"""The Lua scripts of the Redis backplane, and how it runs them (``EVALSHA``).

Every script touches only keys of one namespace, which share the ``{namespace}`` hash tag, so a
Redis Cluster runs each on one node. The epoch key holds ``"{epoch} {after} {added}"``: the epoch,
the stream id after which its entries start, and the stream's ``entries-added`` at that id, so that
an instance that takes a new epoch knows where to read on from.
"""

from __future__ import annotations

from typing import Any, Final

from redis.exceptions import NoScriptError

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
-- One write: every event XADDed in order, those kept in their topic's history there too.
-- KEYS: stream, epoch key, sequences (a hash: topic to its last sequence), then the histories
-- of the topics this write keeps (streams whose ids are "{sequence}-{ms}", fields d, the data,
-- and p, its position). ARGV: a new epoch, max length, the length of a history key's prefix
-- (what precedes the topic), the number of histories T, then T times "max count,max age ms",
-- then each event's history number (1..T; 0: not kept) and each event's length in bytes, both
-- comma-separated, then the events' data end to end: four arguments for any number of events.
-- Then C, the number of idempotency claims (contract section 16), and (C > 0) each claim's
-- "fingerprint window-in-ms answer", newline-separated (their keys last among KEYS, in order),
-- and each event's claim number (1..C; 0: none), comma-separated: three arguments for any
-- number. The events of a claim whose key is taken are not appended: each answers '=' and
-- what the key holds ("fingerprint position answer"); a claim taken now keeps
-- "fingerprint position-of-its-last-event answer" for its window.
-- A kept event's data carries its sequence: {"q":N,...}. Each history takes its sequences in
-- one HINCRBY and is trimmed once, by count and by age, after the write's events.
-- Returns {epoch value, then per event its id and its sequence (0: not kept), or '=' and what
-- its claim's key holds}.
local claims = tonumber(ARGV[8 + tonumber(ARGV[4])])
local claimed, taken, base = {}, {}, #KEYS - claims
local fingerprints, windows, answers = {}, {}, {}
if claims > 0 then
  for fingerprint, window, answer in string.gmatch(ARGV[9 + tonumber(ARGV[4])],
      '([^ \\n]+) (%d+) ([^\\n]+)') do
    fingerprints[#fingerprints + 1] = fingerprint
    windows[#windows + 1] = window
    answers[#answers + 1] = answer
  end
  for c in string.gmatch(ARGV[10 + tonumber(ARGV[4])], '%d+') do
    claimed[#claimed + 1] = tonumber(c)
  end
  for c = 1, claims do taken[c] = redis.call('GET', KEYS[base + c]) end
end
local function skipped(i)
  local c = claimed[i]
  return c ~= nil and c > 0 and taken[c]
end
local value = redis.call('GET', KEYS[2])
if not value or redis.call('EXISTS', KEYS[1]) == 0 then
  value = new_epoch(KEYS[1], KEYS[2], ARGV[1], false)
end
local epoch = string.match(value, '^[^ ]*')
local prefix, histories = tonumber(ARGV[3]), tonumber(ARGV[4])
local numbers, lengths, blob = {}, {}, ARGV[7 + histories]
for k in string.gmatch(ARGV[5 + histories], '%d+') do numbers[#numbers + 1] = tonumber(k) end
for n in string.gmatch(ARGV[6 + histories], '%d+') do lengths[#lengths + 1] = tonumber(n) end
local function ms_of(id) return tonumber(string.match(id, '-(%d+)$')) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local kept = {}
for k = 1, histories do kept[k] = 0 end
for i, k in ipairs(numbers) do
  if k > 0 and not skipped(i) then kept[k] = kept[k] + 1 end
end
local next_seq, ms = {}, {}
for k = 1, histories do  -- each history keeps at least one of the events
  local key = KEYS[3 + k]
  local topic = string.sub(key, prefix + 1)
  ms[k] = now
  local last = redis.call('HINCRBY', KEYS[3], topic, kept[k])
  if last == kept[k] then  -- a new topic, or its sequence lost (the hash deleted)
    local newest = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
    if newest then
      last = tonumber(string.match(newest[1], '^(%d+)-')) + kept[k]
      redis.call('HSET', KEYS[3], topic, last)
      ms[k] = math.max(now, ms_of(newest[1]))
    end
  end
  next_seq[k] = last - kept[k] + 1
end
local out, from, last_of = {value}, 1, {}
for i, k in ipairs(numbers) do
  local data = string.sub(blob, from, from + lengths[i] - 1)
  from = from + lengths[i]
  if skipped(i) then
    out[#out + 1] = '='
    out[#out + 1] = taken[claimed[i]]
  elseif k == 0 then
    out[#out + 1] = redis.call('XADD', KEYS[1], '*', 'd', data)
    out[#out + 1] = 0
  else
    local seq = next_seq[k]
    next_seq[k] = seq + 1
    data = '{"q":' .. string.format('%d', seq) .. ',' .. string.sub(data, 2)
    local entry = redis.call('XADD', KEYS[1], '*', 'd', data)
    redis.call('XADD', KEYS[3 + k], string.format('%d-%d', seq, ms[k]), 'd', data, 'p',
      epoch .. '.' .. entry)
    out[#out + 1] = entry
    out[#out + 1] = seq
  end
  if claims > 0 and claimed[i] > 0 and not skipped(i) then last_of[claimed[i]] = out[#out - 1] end
end
redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', ARGV[2])
for k = 1, histories do
  local key = KEYS[3 + k]
  local max_count, max_age = string.match(ARGV[4 + k], '^(%d+),(%d+)$')
  redis.call('XTRIM', key, 'MAXLEN', max_count)
  local cutoff = ms[k] - tonumber(max_age)
  local oldest = redis.call('XRANGE', key, '-', '+', 'COUNT', 1)[1]
  local rounds = 10  -- drop the front past max age, 100 at a time, at most 1,000 a write
  while oldest and rounds > 0 and ms_of(oldest[1]) < cutoff do
    rounds = rounds - 1
    local front = redis.call('XRANGE', key, '-', '+', 'COUNT', 100)
    local keep = string.format('%d-0', tonumber(string.match(front[#front][1], '^(%d+)-')) + 1)
    local more = true
    for _, old in ipairs(front) do
      if ms_of(old[1]) >= cutoff then keep, more = old[1], false break end
    end
    redis.call('XTRIM', key, 'MINID', keep)
    oldest = more and redis.call('XRANGE', key, '-', '+', 'COUNT', 1)[1]
  end
end
for c = 1, claims do
  if not taken[c] and last_of[c] then
    local kept_value = fingerprints[c] .. ' ' .. epoch .. '.' .. last_of[c] .. ' ' .. answers[c]
    redis.call('SET', KEYS[base + c], kept_value, 'PX', windows[c])
  end
end
return out
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

_LEASE: Final = """
-- A lease is a hash: 'owner', and per instance holding it when its hold ends (ms, Redis time).
-- Holds that ended are dropped; ARGV[2] is this instance, whose hold is told from the others'.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local owner, mine, others, last = false, false, 0, now
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local name, value = fields[i], fields[i + 1]
  if name == 'owner' then owner = value
  elseif tonumber(value) <= now then redis.call('HDEL', KEYS[1], name)
  elseif name == ARGV[2] then mine = true
  else others, last = others + 1, math.max(last, tonumber(value)) end
end
"""

HOLD: Final = (
    _LEASE
    + """
-- KEYS: a lease; ARGV: owner, this instance, ms. Free (no hold lasts) or ARGV[1]'s: this
-- instance holds it for ARGV[1] until ARGV[3] ms from now (1); another owner's: 0.
if owner ~= ARGV[1] and (mine or others > 0) then return 0 end
if owner ~= ARGV[1] then redis.call('DEL', KEYS[1]) end
local ends = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], ARGV[2], string.format('%d', ends))
redis.call('PEXPIREAT', KEYS[1], string.format('%d', math.max(last, ends)))
return 1
"""
)

LET_GO: Final = (
    _LEASE
    + """
-- KEYS: a lease; ARGV: owner, this instance. ARGV[1]'s: this instance's hold ends, and the
-- lease with it when no other instance's lasts (1); another owner's: 0.
if owner ~= ARGV[1] then return 0 end
if others == 0 then redis.call('DEL', KEYS[1]) else redis.call('HDEL', KEYS[1], ARGV[2]) end
return 1
"""
)


class Scripts:
    """The scripts' SHA1s, for ``EVALSHA`` in a pipeline; loaded again where Redis lacks them."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._registered = {
            name: client.register_script(source)
            for name, source in {
                "publish": PUBLISH,
                "look": LOOK,
                "heartbeat": HEARTBEAT,
                "live": LIVE,
                "claim": CLAIM,
                "hold": HOLD,
                "let_go": LET_GO,
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
