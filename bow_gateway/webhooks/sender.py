"""Sending: one shared ``aiohttp.ClientSession`` per instance, at most ``max_concurrency``
requests in flight per webhook, ``timeout`` s per request, signed per attempt; retries with
capped exponential backoff and equal jitter, honouring ``Retry-After``."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Final
from urllib.parse import urlsplit

import aiohttp

from ..core.webhook_settings import Webhook
from ..runtime.metrics import Metrics
from ..runtime.ratelimit import rate_limited
from .signing import signed_headers

logger = rate_limited("bow_gateway.webhooks")

RETRIED_STATUSES: Final = frozenset({408, 429})
MAX_ERROR: Final = 300
"""Characters of ``last_error`` kept."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a delivery ended: ``delivered`` (a ``2xx``) or not, after ``attempts``."""

    delivered: bool
    attempts: int
    last_status: int | None
    last_error: str


def backoff(attempt: int, base: float, cap: float) -> float:
    """Seconds before attempt ``attempt + 1``: ``base * 2**(attempt - 1)`` capped, equal jitter
    (half of it, plus up to the other half at random)."""
    ceiling: float = min(cap, base * 2.0 ** min(attempt - 1, 32))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def retry_after(value: str | None, cap: float) -> float | None:
    """``Retry-After``'s seconds (a number or an HTTP date), at most ``cap``; ``None`` if absent
    or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(cap, max(0.0, seconds))


class Sender:
    """Requests to ``webhooks``; ``backoff_base`` and ``backoff_cap`` (s) shape the retries,
    a ``Retry-After`` is followed up to ``max_retry_after`` s."""

    def __init__(
        self,
        webhooks: Sequence[Webhook],
        metrics: Metrics,
        *,
        backoff_base: float = 1.0,
        backoff_cap: float = 300.0,
        max_retry_after: float = 300.0,
    ) -> None:
        self._webhooks = list(webhooks)
        self._metrics = metrics
        self._base = backoff_base
        self._cap = backoff_cap
        self._max_retry_after = max_retry_after
        self._limits = [asyncio.Semaphore(webhook.max_concurrency) for webhook in webhooks]
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0)  # the semaphores bound each webhook
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def deliver(self, index: int, webhook_id: str, body: bytes) -> Outcome:
        """Send until a ``2xx``, a status not retried, or ``max_attempts``."""
        webhook = self._webhooks[index]
        label = str(index)
        attempt = 0
        while True:
            attempt += 1
            status, error, wait = await self._attempt(index, webhook_id, body)
            if status is not None and 200 <= status < 300:
                self._metrics.webhook_requests.labels(label, "delivered").inc()
                return Outcome(True, attempt, status, "")
            retried = status is None or status in RETRIED_STATUSES or status >= 500
            if not retried or attempt >= webhook.max_attempts:
                self._metrics.webhook_requests.labels(label, "dead").inc()
                return Outcome(False, attempt, status, error)
            self._metrics.webhook_requests.labels(label, "retried").inc()
            delay = wait if wait is not None else backoff(attempt, self._base, self._cap)
            logger.info(
                "webhook %d (%s): %s attempt %d failed (%s), retried in %.1f s",
                index, webhook.shown_url, webhook_id, attempt, error, delay,
            )  # fmt: skip
            await asyncio.sleep(delay)

    async def _attempt(
        self, index: int, webhook_id: str, body: bytes
    ) -> tuple[int | None, str, float | None]:
        """One request: its status (``None`` after a network error), an error text, and
        ``Retry-After``'s seconds."""
        webhook = self._webhooks[index]
        session = self._session
        if session is None:
            raise RuntimeError("the webhooks' sender is not started")
        headers = signed_headers(webhook.key, webhook_id, body)
        timeout = aiohttp.ClientTimeout(total=webhook.timeout)
        async with self._limits[index]:
            try:
                async with session.post(
                    webhook.url, data=body, headers=headers, timeout=timeout, allow_redirects=False
                ) as response:
                    await response.content.readany()  # a little of it: the status is what counts
                    status = response.status
                    wait = retry_after(response.headers.get("Retry-After"), self._max_retry_after)
            except TimeoutError:
                return None, f"no answer within {webhook.timeout:g} s", None
            except (aiohttp.ClientError, OSError) as error:
                return None, _error_text(error, webhook), None
        return status, "" if 200 <= status < 300 else f"HTTP {status}", wait


def _error_text(error: BaseException, webhook: Webhook) -> str:
    """What went wrong, without the URL's userinfo."""
    text = f"{type(error).__name__}: {error}".replace(webhook.url, webhook.shown_url)
    userinfo = urlsplit(webhook.url).netloc.rpartition("@")[0]
    if userinfo:
        text = text.replace(userinfo, "***")
    return text[:MAX_ERROR]
