"""``WebPush``: the webhook engine's destination of ``message.undelivered`` (contract section 20).
Each event's message goes to every subscription of its listeners as an encrypted Web Push
(RFC 8030, 8291, 8292), at most ``max_concurrency`` requests at once; each subscription is retried
as a webhook is (a connection error, a timeout, ``408``, ``429``, ``5xx``; backoff with jitter,
``Retry-After``), dropped on ``404``/``410``. The event is delivered once every subscription took
it or was dropped; else it is a dead letter, which a replay sends to every subscription again."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from ...backplanes import BackplaneUnavailable
from ...core.message import dumps
from ...core.webpush_settings import WebPushSettings
from ...runtime.ratelimit import rate_limited
from ...webhooks.events import WebhookEvent
from ...webhooks.sender import RETRIED_STATUSES, Outcome, backoff, retry_after
from .encryption import MAX_PLAINTEXT, encrypted
from .metrics import WebPushMetrics
from .store import SubscriptionStore
from .subscription import Subscription, listener_key
from .subscriptions import Subscriptions
from .vapid import Vapid

logger = rate_limited("bow_gateway.webpush")

UNDELIVERED: Final = "message.undelivered"
GONE: Final = frozenset({404, 410})
TAG: Final = "webpush"


@dataclass(frozen=True, slots=True)
class _Push:
    """How one subscription's push ended: ``ok`` (sent, or the subscription dropped) or not."""

    ok: bool
    attempts: int = 1
    status: int | None = None
    error: str = ""


class WebPush:
    """The connector (a :class:`~bow_gateway.webhooks.Connector`); ``backoff_base`` and
    ``backoff_cap`` (s) shape the retries as the webhooks' do."""

    tag: Final = TAG
    events: Final = frozenset({UNDELIVERED})
    shown_url: Final = "webpush:"

    def __init__(
        self,
        settings: WebPushSettings,
        store: SubscriptionStore,
        metrics: WebPushMetrics,
        *,
        backoff_base: float = 1.0,
        backoff_cap: float = 300.0,
        max_retry_after: float = 300.0,
    ) -> None:
        self.settings = settings
        self.store = store
        self.subscriptions = Subscriptions(
            store, metrics, allow_http_loopback=settings.allow_http_loopback
        )
        self._metrics = metrics
        self._vapid = Vapid(settings)
        self._base, self._cap, self._max_retry_after = backoff_base, backoff_cap, max_retry_after
        self._limit = asyncio.Semaphore(settings.max_concurrency)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0)  # the semaphore bounds the requests
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        await self.store.close()

    async def deliver(self, webhook_id: str, event: WebhookEvent) -> Outcome:
        """Every subscription of the event's listeners pushed (or dropped)."""
        message = event.data.get("message") or {}
        listeners: Sequence[Any] = event.data.get("listeners") or []
        body = push_body(message)
        found, outcome = await self._subscriptions(listeners)
        if outcome is not None:
            return outcome
        pushes = [self._push(key, sub, body) for key, subs in found.items() for sub in subs]
        results = await asyncio.gather(*pushes)
        failed = [result for result in results if not result.ok]
        if not failed:
            return Outcome(True, 1, None, "")
        last = failed[-1]
        logger.warning(
            "webpush: %s reached %d of %d subscriptions: %s",
            webhook_id, len(results) - len(failed), len(results), last.error,
        )  # fmt: skip
        error = f"{len(failed)} of {len(results)} subscriptions failed, the last: {last.error}"
        return Outcome(False, max(r.attempts for r in failed), last.status, error)

    async def _subscriptions(
        self, listeners: Sequence[Any]
    ) -> tuple[dict[str, list[Subscription]], Outcome | None]:
        """The listeners' subscriptions, the store tried as a push is; or the outcome of
        failing to read them."""
        keys = []
        for listener in listeners:
            try:
                keys.append(listener_key(listener))
            except ValueError:
                continue  # not an id: no subscription
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self.store.of(keys), None
            except BackplaneUnavailable as error:
                if attempt >= self.settings.max_attempts:
                    return {}, Outcome(False, attempt, None, f"subscriptions unread: {error}")
                await asyncio.sleep(backoff(attempt, self._base, self._cap))

    async def _push(self, key: str, subscription: Subscription, body: bytes) -> _Push:
        """One subscription pushed until accepted, gone, refused or ``max_attempts``."""
        attempt = 0
        while True:
            attempt += 1
            status, error, wait = await self._attempt(subscription, body)
            if status is not None and 200 <= status < 300:
                self._metrics.sent.inc()
                return _Push(True, attempt, status)
            if status in GONE:
                await self._drop(key, subscription, status)
                return _Push(True, attempt, status)
            self._metrics.failed.labels("error" if status is None else str(status)).inc()
            retried = status is None or status in RETRIED_STATUSES or status >= 500
            if not retried or attempt >= self.settings.max_attempts:
                return _Push(False, attempt, status, error)
            delay = wait if wait is not None else backoff(attempt, self._base, self._cap)
            await asyncio.sleep(delay)

    async def _drop(self, key: str, subscription: Subscription, status: int) -> None:
        """The push service says the subscription is gone: forget it (if still the same one)."""
        try:
            removed = await self.store.remove(subscription.endpoint, key)
        except BackplaneUnavailable as error:  # told; the next push drops it again
            logger.warning("webpush: could not drop a subscription gone (%d): %s", status, error)
            return
        if removed:
            self._metrics.removed.labels(str(status)).inc()
            logger.info("webpush: dropped a subscription at %s: %d", subscription.origin, status)

    async def _attempt(
        self, subscription: Subscription, body: bytes
    ) -> tuple[int | None, str, float | None]:
        """One request: its status (``None`` after a network error), an error text (with the
        push service's origin, never the endpoint's path: it is a capability), ``Retry-After``."""
        session = self._session
        if session is None:
            raise RuntimeError("the Web Push connector is not started")
        origin = subscription.origin
        headers = {
            "Authorization": self._vapid.header(origin),
            "TTL": str(self.settings.ttl),
            "Content-Encoding": "aes128gcm",
            "Content-Type": "application/octet-stream",
        }
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout)
        async with self._limit:
            data = encrypted(body, subscription)
            try:
                async with session.post(
                    subscription.endpoint,
                    data=data,
                    headers=headers,
                    timeout=timeout,
                    allow_redirects=False,
                ) as response:
                    await response.content.readany()
                    status = response.status
                    wait = retry_after(response.headers.get("Retry-After"), self._max_retry_after)
            except TimeoutError:
                return None, f"{origin}: no answer within {self.settings.timeout:g} s", None
            except (aiohttp.ClientError, OSError) as error:
                return None, f"{origin}: {type(error).__name__}", None
        return status, "" if 200 <= status < 300 else f"{origin}: HTTP {status}", wait


def push_body(message: Any) -> bytes:
    """What a push carries: ``{"id", "name", "payload"}`` as JSON; past one record's
    :data:`~.encryption.MAX_PLAINTEXT` bytes, ``{"id", "name", "truncated": true}`` (the
    service worker fetches the rest from its backend)."""
    fields = {name: message.get(name) for name in ("id", "name", "payload")}
    body = dumps(fields)
    if len(body) <= MAX_PLAINTEXT:
        return body
    return dumps({"id": fields["id"], "name": fields["name"], "truncated": True})
