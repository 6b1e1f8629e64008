"""Criteria precomputed by ``bow-gateway criteria-job``, read from Redis: one ``HGET`` per listener.

The job writes every listener's criteria into a snapshot of bucket hashes and points
``{{namespace}:criteria}:live`` at it (see :mod:`bow_gateway.core.criteria_snapshot`). This
middleware reads the pointer (cached, re-read when a snapshot goes live), then the listener's
field. An id the snapshot does not hold is refused (the socket gets an ``alert``), or handed to
``fallback``.

It *watches*: when a new snapshot goes live, or an incremental run names listeners whose criteria
changed, :meth:`PrecomputedCriteria.watch` tells the gateway, which re-reads the criteria of the
listeners it holds and re-indexes them without disconnecting anyone.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from bow_gateway.core.criteria import ListenerId
from bow_gateway.core.criteria_snapshot import DEFAULT_NAMESPACE, Layout, Live, parse_change
from bow_gateway.core.plugins import CreateCriteriaFromListenerDetails, resolve
from bow_gateway.runtime.redis_client import (
    AsyncClient,
    RedisSettings,
    check_settings,
    redis_client,
    subscribe,
)

logger = logging.getLogger(__name__)


class PrecomputedCriteria:
    """``create_criteria_from_listener_details`` backed by the criteria job's live snapshot.

    ``redis``: what :func:`bow_gateway.runtime.redis_client.redis_client` takes (a URL, a dict of
    redis-py connection settings, Sentinel's, or a list of cluster nodes); by default the URL in the
    environment variable ``redis_env``. ``fallback``: a middleware function (plain or coroutine,
    or its ``"module:function"`` name) for ids the snapshot does not hold; without it they are
    refused. ``pointer_ttl``: seconds the live pointer is trusted without a notification.
    """

    def __init__(
        self,
        redis: RedisSettings | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        fallback: CreateCriteriaFromListenerDetails | str | None = None,
        *,
        redis_env: str = "BOW_REDIS_URL",
        pointer_ttl: float = 5.0,
        ping_interval: float = 10.0,
        max_backoff: float = 5.0,
    ) -> None:
        if redis is None:
            redis = os.environ.get(redis_env) or None
            if redis is None:
                raise ValueError(
                    f"redis: not given, and the environment variable {redis_env} is not set"
                )
        try:
            redis = check_settings(redis)
        except ValueError as error:
            raise ValueError(f"redis: {error}") from None
        if isinstance(fallback, str):
            try:
                fallback = resolve(fallback)
            except ValueError as error:
                raise ValueError(f"fallback: {error}") from None
        if fallback is not None and not callable(fallback):
            raise ValueError("fallback must be a middleware function")
        self.redis = redis
        self.layout = Layout(namespace)
        self.fallback = fallback
        self._pointer_ttl = pointer_ttl
        self._ping_interval = ping_interval
        self._max_backoff = max_backoff
        self._client: AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live: Live | None = None
        self._live_read = float("-inf")

    async def __call__(self, details: Mapping[str, Any]) -> Any:
        listener_id: ListenerId = details["id"]
        live, fresh = await self._pointer()
        raw = None if live is None else await self._read(live, listener_id)
        if raw is None and not fresh:
            # The pointer may have moved before this instance heard of it: look once more.
            previous = live
            live, _ = await self._pointer(reload=True)
            if live is not None and live != previous:
                raw = await self._read(live, listener_id)
        if raw is not None:
            assert live is not None
            return live.criteria(raw)
        if self.fallback is not None:
            result = self.fallback(details)
            return await result if inspect.isawaitable(result) else result
        if live is None:
            raise LookupError(
                "no precomputed criteria yet: run `bow-gateway criteria-job` (nothing at"
                f" {self.layout.live_key})"
            )
        raise LookupError(f"listener {listener_id!r} has no precomputed criteria")

    async def watch(self) -> AsyncIterator[list[ListenerId] | None]:
        """``None`` when a snapshot goes live (or after a reconnection), else the changed ids."""
        backoff = 0.1
        reconnected = False
        while True:
            # Without redis-py's silent reconnection: this loop must know about every one.
            client = self._connect(retry=Retry(NoBackoff(), 0))
            pubsub = client.pubsub()
            try:
                await subscribe(client, pubsub, self.layout.changes_channel)
                if reconnected:  # notifications may have been missed meanwhile
                    self._forget_pointer()
                    yield None
                backoff = 0.1
                async for change in self._changes(pubsub):
                    if change is None:
                        self._forget_pointer()
                    yield change
            except (RedisError, OSError, TimeoutError) as error:
                logger.warning("criteria notifications: %s; reconnecting in %.1f s", error, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
            finally:
                reconnected = True
                try:
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                    await client.aclose()
                except (RedisError, OSError):
                    pass

    async def _changes(self, pubsub: Any) -> AsyncIterator[list[ListenerId] | None]:
        """The notifications; a connection silent for three pings counts as lost."""
        heard = time.monotonic()
        while True:
            message = await pubsub.get_message(timeout=self._ping_interval)
            if message is None:
                if time.monotonic() - heard > 3 * self._ping_interval:
                    raise TimeoutError("no answer from Redis to three pings")
                await pubsub.ping()
                continue
            heard = time.monotonic()
            if message.get("type") != "message":
                continue  # subscribe confirmations, pongs
            try:
                yield parse_change(message["data"])
            except ValueError as error:
                logger.warning("ignored a malformed criteria notification: %s", error)

    async def aclose(self) -> None:
        """Disconnect from Redis (``Bow.stop()`` calls this)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _pointer(self, reload: bool = False) -> tuple[Live | None, bool]:
        """The live pointer, and whether it was just read from Redis (not from the cache)."""
        if reload or time.monotonic() - self._live_read > self._pointer_ttl:
            self._live = Live.from_json(await self._redis().get(self.layout.live_key))
            self._live_read = time.monotonic()
            return self._live, True
        return self._live, False

    def _forget_pointer(self) -> None:
        self._live_read = float("-inf")

    async def _read(self, live: Live, listener_id: ListenerId) -> bytes | str | None:
        key, field = self.layout.key_of(live.snapshot, live.buckets, listener_id)
        raw: bytes | str | None = await self._redis().hget(key, field)
        return raw

    def _redis(self) -> AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = self._connect()
            self._loop = loop
        return self._client

    def _connect(self, **options: Any) -> AsyncClient:
        return redis_client(self.redis, **options)

    def __repr__(self) -> str:  # never shows the URL, which may hold a password
        return f"PrecomputedCriteria(namespace={self.layout.namespace!r})"
