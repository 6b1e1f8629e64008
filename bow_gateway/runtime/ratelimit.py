"""Rate limits: a token bucket, and a logging filter built on one so that no client can make the
gateway write more than a bounded amount of log."""

from __future__ import annotations

import logging
import time


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; :meth:`take` spends one if it can."""

    __slots__ = ("_burst", "_rate", "_stamp", "_tokens")

    def __init__(self, rate: float, burst: float) -> None:
        self._rate = rate
        self._burst = burst
        self._tokens = burst
        self._stamp = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        if tokens < 1:
            self._tokens = tokens
            return False
        self._tokens = tokens - 1
        return True

    def give_back(self) -> None:
        """Return a token :meth:`take` spent (on what turned out not to count), up to the
        burst."""
        self._tokens = min(self._burst, self._tokens + 1)

    def delay(self) -> float:
        """Seconds until :meth:`take` can spend a token (0: now), spending nothing."""
        tokens = self._tokens + (time.monotonic() - self._stamp) * self._rate
        return 0.0 if tokens >= 1 else (1 - tokens) / self._rate

    def reserve(self, max_wait: float) -> float | None:
        """Spend one token, now or in the future: the seconds to wait before using it (0: now),
        or None, spending nothing, when it would be more than ``max_wait`` away. Reservations
        queue (each waits for the one before), so at most ``rate * max_wait`` are outstanding."""
        now = time.monotonic()
        tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        delay = 0.0 if tokens >= 1 else (1 - tokens) / self._rate
        if delay > max_wait:
            self._tokens = tokens
            return None
        self._tokens = tokens - 1
        return delay


class LogRateLimit(logging.Filter):
    """Passes ``burst`` records, then ``rate`` a second; the next one passed says how many were
    dropped. Attached to the loggers that clients can make speak (a malformed packet, a bad
    request, a connection), so that a flood of them costs a bounded amount of log and CPU.
    Warnings and errors have a bucket of their own: a flood of INFO lines never hides them."""

    def __init__(self, rate: float = 10.0, burst: float = 100.0) -> None:
        super().__init__()
        self._buckets = (TokenBucket(rate, burst), TokenBucket(rate, burst))
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._buckets[record.levelno >= logging.WARNING].take():
            self.dropped += 1
            return False
        if self.dropped:
            record.msg = f"{record.getMessage()} ({self.dropped} lines dropped by the rate limit)"
            record.args = None
            self.dropped = 0
        return True


def rate_limited(name: str, rate: float = 10.0, burst: float = 100.0) -> logging.Logger:
    """The logger ``name``, with one :class:`LogRateLimit` (however often it is asked for)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, LogRateLimit) for f in logger.filters):
        logger.addFilter(LogRateLimit(rate, burst))
    return logger
