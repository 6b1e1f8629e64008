"""Where push subscriptions are kept, by listener: the interface both stores keep
(:class:`MemorySubscriptions` here, :mod:`.store_redis` in Redis). An endpoint belongs to one
listener at a time (stored again for another, it moves); a listener holds at most
``max_per_listener``, the oldest dropped for a new one; at most ``max_total`` in all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .subscription import Subscription


class Full(ValueError):
    """``max_total`` subscriptions are held: a new endpoint is refused."""


class SubscriptionStore(Protocol):
    """The subscriptions of every listener (keyed by :func:`.subscription.listener_key`)."""

    async def add(self, key: str, subscription: Subscription) -> list[str]:
        """Store (or refresh) ``subscription`` for ``key``; the endpoints dropped to keep
        ``max_per_listener``. :class:`Full` past ``max_total``; ``BackplaneUnavailable``."""
        ...

    async def remove(self, endpoint: str, key: str | None = None) -> int:
        """Forget ``endpoint`` (only if it is ``key``'s, given): 1, or 0 if it was not held."""
        ...

    async def remove_listener(self, key: str) -> int:
        """Forget every subscription of ``key``; how many there were."""
        ...

    async def of(self, keys: Sequence[str]) -> dict[str, list[Subscription]]:
        """The subscriptions of each of ``keys`` that has some."""
        ...

    async def close(self) -> None: ...


class MemorySubscriptions:
    """:class:`SubscriptionStore` in this process (a gateway without Redis): lost at a restart."""

    def __init__(self, *, max_per_listener: int = 10, max_total: int = 1_000_000) -> None:
        self.max_per_listener = max_per_listener
        self.max_total = max_total
        self._by_key: dict[str, dict[str, Subscription]] = {}  # endpoint: subscription, in order
        self._owner: dict[str, str] = {}  # endpoint: key

    async def add(self, key: str, subscription: Subscription) -> list[str]:
        endpoint = subscription.endpoint
        if endpoint not in self._owner and len(self._owner) >= self.max_total:
            raise Full(f"the gateway holds {self.max_total} push subscriptions, its bound")
        await self.remove(endpoint)
        held = self._by_key.setdefault(key, {})
        held[endpoint] = subscription
        self._owner[endpoint] = key
        dropped = []
        while len(held) > self.max_per_listener:
            oldest = min(held.values(), key=lambda s: s.at).endpoint
            del held[oldest], self._owner[oldest]
            dropped.append(oldest)
        return dropped

    async def remove(self, endpoint: str, key: str | None = None) -> int:
        owner = self._owner.get(endpoint)
        if owner is None or (key is not None and owner != key):
            return 0
        del self._owner[endpoint]
        held = self._by_key[owner]
        del held[endpoint]
        if not held:
            del self._by_key[owner]
        return 1

    async def remove_listener(self, key: str) -> int:
        held = self._by_key.pop(key, {})
        for endpoint in held:
            del self._owner[endpoint]
        return len(held)

    async def of(self, keys: Sequence[str]) -> dict[str, list[Subscription]]:
        return {key: list(self._by_key[key].values()) for key in keys if key in self._by_key}

    async def close(self) -> None:
        return None
