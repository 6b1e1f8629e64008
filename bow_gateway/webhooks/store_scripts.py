"""The Lua scripts of :mod:`.store_redis`: each write to the webhooks' keys is one script call,
atomic. :data:`APPEND_LUA` is also for other scripts to paste (see :mod:`.store_redis`)."""

from __future__ import annotations

from typing import Final

APPEND_LUA: Final = """
local function bow_webhooks_append(stream, overflow, max_backlog, max_dead, event)
  if redis.call('XLEN', stream) < tonumber(max_backlog) then
    redis.call('XADD', stream, '*', 'e', event)
    return 1
  end
  redis.call('XADD', overflow, 'MAXLEN', '~', max_dead, '*', 'e', event)
  return 0
end
"""

EMIT: Final = """
-- KEYS: stream, overflow; ARGV: max_backlog, max_dead, events...
local stored = 0
for i = 3, #ARGV do
  stored = stored + bow_webhooks_append(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[i])
end
return stored
"""

FINISH: Final = """
-- KEYS: stream, done, dead; ARGV: group, max_dead, then (entry, tag, targets, letter or '')...
for i = 3, #ARGV, 4 do
  local id, tag, targets, letter = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  if letter ~= '' then
    redis.call('XADD', KEYS[3], 'MAXLEN', ARGV[2], '*', 'd', letter)
  end
  local finished = targets <= 1
  if not finished then
    local seen = redis.call('HGET', KEYS[2], id) or ''
    local count, has = 0, false
    for t in string.gmatch(seen, '[^,]+') do
      count = count + 1
      if t == tag then has = true end
    end
    if not has then
      count = count + 1
      seen = seen .. ',' .. tag
    end
    if count >= targets then
      finished = true
      redis.call('HDEL', KEYS[2], id)
    else
      redis.call('HSET', KEYS[2], id, seen)
    end
  end
  if finished then
    redis.call('XACK', KEYS[1], ARGV[1], id)
    redis.call('XDEL', KEYS[1], id)
  end
end
return 1
"""

HOLD: Final = """
-- KEYS: lease; ARGV: holder, ttl in ms. 1 if the holder has it now.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""

BURY: Final = """
-- KEYS: overflow, dead; ARGV: max_dead, n, n letters, then the overflow ids
local n = tonumber(ARGV[2])
for i = 3, 2 + n do
  redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[1], '*', 'd', ARGV[i])
end
for i = 3 + n, #ARGV do
  redis.call('XDEL', KEYS[1], ARGV[i])
end
return 1
"""

REPLAY: Final = """
-- KEYS: stream, dead; ARGV: max_backlog, then (dead entry id, event, tag, webhook id)...
local replayed = 0
for i = 2, #ARGV, 4 do
  local room = redis.call('XLEN', KEYS[1]) < tonumber(ARGV[1])
  if room and redis.call('XDEL', KEYS[2], ARGV[i]) == 1 then
    redis.call('XADD', KEYS[1], '*', 'e', ARGV[i + 1], 'w', ARGV[i + 2], 'i', ARGV[i + 3])
    replayed = replayed + 1
  end
end
return replayed
"""
