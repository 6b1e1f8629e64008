"""Push subscriptions in Redis (a gateway with Redis), under the backplane's ``{namespace}``
hash tag (one Redis Cluster slot, so that one script may touch every key):

- ``{ns}:webpush:listener:{id}``: a hash per listener (``{id}`` its id's JSON text), endpoint to
  the subscription's JSON (``{"endpoint", "keys": {"p256dh", "auth"}, "at"}``);
- ``{ns}:webpush:endpoints``: a hash, endpoint to the JSON text of the listener holding it (what
  ``DELETE`` by endpoint and the move of an endpoint to another listener need).

Each change is one script, so both hashes always agree."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

from ...backplanes import BackplaneUnavailable
from ...backplanes.redis_instances import FAILURES
from ...runtime.redis_client import RedisSettings, redis_client
from .store import Full
from .subscription import Subscription

# KEYS: endpoints, this listener's hash. ARGV: endpoint, subscription, key, per listener, total,
# the listeners' prefix. The dropped endpoints, or -1 when the total is reached.
ADD: Final = """
local owner = redis.call('HGET', KEYS[1], ARGV[1])
if not owner and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[5]) then return -1 end
if owner and owner ~= ARGV[3] then redis.call('HDEL', ARGV[6] .. owner, ARGV[1]) end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
local dropped = {}
while redis.call('HLEN', KEYS[2]) > tonumber(ARGV[4]) do
  local all = redis.call('HGETALL', KEYS[2])
  local oldest, at = nil, nil
  for i = 1, #all, 2 do
    local when = tonumber(cjson.decode(all[i + 1])['at'])
    if at == nil or when < at then oldest, at = all[i], when end
  end
  redis.call('HDEL', KEYS[2], oldest)
  redis.call('HDEL', KEYS[1], oldest)
  dropped[#dropped + 1] = oldest
end
return dropped
"""
# KEYS: endpoints. ARGV: endpoint, the key it must be held by ("" for any), the listeners' prefix.
REMOVE: Final = """
local owner = redis.call('HGET', KEYS[1], ARGV[1])
if not owner or (ARGV[2] ~= '' and owner ~= ARGV[2]) then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', ARGV[3] .. owner, ARGV[1])
return 1
"""
# KEYS: endpoints, the listener's hash. ARGV: the listener's key.
REMOVE_LISTENER: Final = """
local endpoints = redis.call('HKEYS', KEYS[2])
for _, endpoint in ipairs(endpoints) do
  if redis.call('HGET', KEYS[1], endpoint) == ARGV[1] then redis.call('HDEL', KEYS[1], endpoint) end
end
redis.call('DEL', KEYS[2])
return #endpoints
"""


class RedisSubscriptions:
    """:class:`~.store.SubscriptionStore` in Redis (see the module), shared by every instance of
    ``namespace``; each call within ``timeout`` s, else ``BackplaneUnavailable``."""

    def __init__(
        self,
        redis: RedisSettings,
        *,
        namespace: str = "bow",
        max_per_listener: int = 10,
        max_total: int = 1_000_000,
        timeout: float = 2.0,
    ) -> None:
        self.max_per_listener = max_per_listener
        self.max_total = max_total
        self.endpoints_key = f"{{{namespace}}}:webpush:endpoints"
        self.prefix = f"{{{namespace}}}:webpush:listener:"
        self._timeout = timeout
        self._client: Any = redis_client(redis, decode_responses=True)
        self._scripts = {
            name: self._client.register_script(source)
            for name, source in (("add", ADD), ("remove", REMOVE), ("listener", REMOVE_LISTENER))
        }

    async def _run(self, what: str, name: str, keys: list[str], args: list[Any]) -> Any:
        try:
            async with asyncio.timeout(self._timeout):
                return await self._scripts[name](keys=keys, args=args)
        except FAILURES as error:
            raise BackplaneUnavailable(f"Redis did not {what}: {error}") from error

    async def add(self, key: str, subscription: Subscription) -> list[str]:
        keys = [self.endpoints_key, self.prefix + key]
        args = [
            subscription.endpoint,
            subscription.stored().decode(),
            key,
            self.max_per_listener,
            self.max_total,
            self.prefix,
        ]
        dropped = await self._run("store a push subscription", "add", keys, args)
        if dropped == -1:
            raise Full(f"the gateway holds {self.max_total} push subscriptions, its bound")
        return list(dropped)

    async def remove(self, endpoint: str, key: str | None = None) -> int:
        args = [endpoint, key or "", self.prefix]
        keys = [self.endpoints_key]
        removed: int = await self._run("remove a subscription", "remove", keys, args)
        return removed

    async def remove_listener(self, key: str) -> int:
        keys = [self.endpoints_key, self.prefix + key]
        removed: int = await self._run("remove subscriptions", "listener", keys, [key])
        return removed

    async def of(self, keys: Sequence[str]) -> dict[str, list[Subscription]]:
        try:
            async with asyncio.timeout(self._timeout):
                async with self._client.pipeline(transaction=False) as pipe:
                    for key in keys:
                        pipe.hvals(self.prefix + key)
                    found = await pipe.execute()
        except FAILURES as error:
            raise BackplaneUnavailable(f"Redis did not read push subscriptions: {error}") from error
        return {
            key: [Subscription.loaded(value) for value in values]
            for key, values in zip(keys, found, strict=True)
            if values
        }

    async def close(self) -> None:
        await self._client.aclose()
