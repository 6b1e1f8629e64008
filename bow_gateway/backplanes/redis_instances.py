"""What the instances of one gateway share on Redis besides the stream: who is alive (a heartbeat
in a sorted set), their answers to a request (a list), the sockets each id holds (claims), and
leases (a hash per lease: its owner and each instance's hold, which ends unless renewed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from redis.exceptions import RedisClusterException, RedisError

from .base import BackplaneUnavailable, Report
from .redis_scripts import Scripts

ANSWER_TTL: Final = 10
"""Seconds an answer list lives in Redis (late answers included)."""

logger = logging.getLogger(__name__)
FAILURES = (RedisError, RedisClusterException, OSError, TimeoutError)


class Instances:
    """The instance ``instance_id`` among those of ``namespace``: heartbeats, answers, claims,
    leases.

    ``interval``: seconds between heartbeats; ``live_for``: seconds an instance counts as live
    after its last one.
    """

    def __init__(
        self,
        client: Any,
        scripts: Scripts,
        namespace: str,
        instance_id: str,
        interval: float = 1.0,
        live_for: float = 3.0,
        max_claiming: int = 16,
    ) -> None:
        self._client = client
        self._claiming = asyncio.Semaphore(max_claiming)
        self._scripts = scripts
        self._prefix = f"{{{namespace}}}"
        self.key = f"{self._prefix}:instances"
        self.id = instance_id
        self._interval = interval
        self._live_for = live_for
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    async def start(self) -> None:
        """Beat once (if Redis answers), then every ``interval`` until :meth:`stop`."""
        with contextlib.suppress(*FAILURES):
            async with asyncio.timeout(self._interval):
                await self._beat()
        self._task = asyncio.create_task(self._run(), name=f"heartbeat of {self.id}")

    async def stop(self) -> None:
        """End the heartbeats and leave the live instances (if Redis answers soon)."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopped = True
        task.cancel()
        # Its end, without taking a cancellation of the caller's (the drain timeout) for its own.
        await asyncio.wait({task})
        with contextlib.suppress(asyncio.CancelledError):
            task.result()
        with contextlib.suppress(*FAILURES):
            async with asyncio.timeout(self._interval):
                await self._client.zrem(self.key, self.id)

    async def _run(self) -> None:
        # Until stop(), whose cancellation redis-py may swallow: on CPython 3.11 the wait_for
        # around its socket writes returns the write's result, and drops the cancellation, when
        # the cancellation comes after the write ended but before the task resumed (bpo-42130).
        # The heartbeats then went on, and stop() waited for them the whole drain_timeout.
        while not self._stopped:
            await asyncio.sleep(self._interval)
            try:
                async with asyncio.timeout(self._interval):
                    await self._beat()
            except FAILURES as exc:  # the backplane's reader reports lost connections
                logger.debug("heartbeat of %s failed: %s", self.id, exc)

    async def _beat(self) -> None:
        await self._scripts.run("heartbeat", [self.key], [self.id, self._live_for])

    async def answer(self, request_id: str, data: bytes) -> None:
        """Add this instance's answer to ``request_id``'s list."""
        key = f"{self._prefix}:answers:{request_id}"
        pipeline = self._client.pipeline(transaction=False)
        pipeline.rpush(key, self.id.encode() + b" " + data)
        pipeline.expire(key, ANSWER_TTL)
        try:
            await pipeline.execute()
        except FAILURES as exc:
            raise BackplaneUnavailable(f"Redis did not take the answer: {exc}") from exc

    async def answers(
        self, request_id: str, publish: Callable[[], Awaitable[str]], timeout: float
    ) -> tuple[list[bytes], bool]:
        """The answers of the instances live now (and of any other) within ``timeout``."""
        key = f"{self._prefix}:answers:{request_id}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            live = await self._scripts.run("live", [self.key], [self._live_for])
        except FAILURES as exc:
            raise BackplaneUnavailable(f"Redis did not say which instances live: {exc}") from exc
        expected = {bytes(instance) for instance in live}
        await publish()
        got: list[bytes] = []
        answered: set[bytes] = set()
        try:
            while not expected <= answered and (left := deadline - loop.time()) > 0:
                popped = await self._client.blpop([key], timeout=max(left, 0.001))
                if popped is not None:
                    instance, _, data = bytes(popped[1]).partition(b" ")
                    answered.add(instance)
                    got.append(data)
        except FAILURES as exc:
            logger.warning("lost Redis while collecting the answers to %s: %s", request_id, exc)
            return got, False
        with contextlib.suppress(*FAILURES):
            await self._client.delete(key)
        return got, expected <= answered

    async def report(self, reports: list[Report]) -> None:
        """This instance's reports, each a field of its message's hash, in one pipeline."""
        pipeline = self._client.pipeline(transaction=False)
        for report in reports:
            key = f"{self._prefix}:receipt:{report.message_id}"
            pipeline.hset(key, self.id, report.data)
            pipeline.pexpireat(key, max(1, round(report.until * 1000)))
        try:
            await pipeline.execute()
        except FAILURES as exc:
            raise BackplaneUnavailable(f"Redis did not take the receipts: {exc}") from exc

    async def reports(self, message_id: str) -> tuple[dict[str, bytes], set[str]]:
        """Every instance's report on ``message_id``, and the instances live now."""
        try:
            found = await self._client.hgetall(f"{self._prefix}:receipt:{message_id}")
            live = await self._scripts.run("live", [self.key], [self._live_for])
        except FAILURES as exc:
            raise BackplaneUnavailable(f"Redis did not answer for the receipt: {exc}") from exc
        reports = {_text(instance): bytes(data) for instance, data in found.items()}
        return reports, {_text(instance) for instance in live}

    async def claim(self, key: str, member: str, limit: int) -> bool:
        """Add ``member`` to ``key``'s claims unless ``limit`` live ones hold it (0: no limit)."""
        keys = [f"{self._prefix}:sockets:{key}", self.key]
        try:
            async with self._claiming:  # a burst of reconnections must not empty the pool
                added = await self._scripts.run(
                    "claim", keys, [f"{self.id}:{member}", limit, self._live_for]
                )
        except FAILURES as exc:
            raise BackplaneUnavailable(f"Redis did not take the claim: {exc}") from exc
        return bool(added)

    async def release(self, key: str, member: str) -> None:
        try:
            async with self._claiming:
                await self._client.zrem(f"{self._prefix}:sockets:{key}", f"{self.id}:{member}")
        except FAILURES as exc:
            raise BackplaneUnavailable(f"Redis did not take the release: {exc}") from exc

    async def hold(self, key: str, owner: str, ttl: float) -> bool:
        """This instance's hold of the lease ``key`` for ``owner``, taken or renewed for ``ttl``
        seconds; False when another owner holds it."""
        return bool(await self._lease("hold", key, [owner, self.id, max(1, round(ttl * 1000))]))

    async def let_go(self, key: str, owner: str) -> None:
        await self._lease("let_go", key, [owner, self.id])

    async def _lease(self, script: str, key: str, args: list[Any]) -> Any:
        try:
            async with self._claiming:
                return await self._scripts.run(script, [f"{self._prefix}:lease:{key}"], args)
        except FAILURES as exc:
            raise BackplaneUnavailable(f"Redis did not take the lease: {exc}") from exc


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
