"""How the gateway's HTTP server bounds clients that stall and quiets those that send garbage.

aiohttp offers most of it, through public keyword arguments of ``web.AppRunner``: its keep-alive
timer closes a connection whose next request's headers have not all arrived in time (the timer
runs from the connection's start, and from the end of each response), ``lingering_time`` bounds
how long a body nobody reads is drained, and ``logger`` replaces the logger that reports malformed
requests. A body the gateway waits for is bounded where it is read (the inbound's handler, a
long-polling POST); :func:`handshake_limits` bounds new connections. No private API is used.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from .ratelimit import TokenBucket, rate_limited

logger = logging.getLogger("bow_gateway.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def app_runner(app: web.Application, *, timeout: float = 10.0) -> web.AppRunner:
    """A runner for ``app`` whose clients have ``timeout`` s to send each request's headers
    (counted from the connection's start or the end of its previous response: also how long an
    idle keep-alive connection stays open) and to finish a body the gateway no longer reads.

    Only a connection waiting for a request is timed: a WebSocket, or a long-polling GET the
    gateway holds open, is not cut.
    """
    return web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=1,
        keepalive_timeout=timeout,
        lingering_time=timeout,
        logger=_MalformedRequestLog(rate_limited("bow_gateway.http.server"), {}),
    )


#: How long a handshake past ``outbound.max_connects_per_second`` waits for its turn before it
#: is refused: a herd of clients reconnecting at once (an instance restarted) is let in at the
#: rate, not refused; a flood is still admitted at the rate, with at most ``rate * MAX_WAIT``
#: handshakes waiting.
MAX_WAIT = 2.0


class HandshakeLimits:
    """``outbound.max_sockets`` and ``outbound.max_connects_per_second`` for an instance as a
    whole: every endpoint that opens a connection (Socket.IO, SSE) shares one bucket."""

    def __init__(
        self,
        open_connections: Callable[[], int],
        *,
        max_connections: int = 20_000,
        per_second: float = 500.0,
        max_wait: float = MAX_WAIT,
    ) -> None:
        self._open_connections = open_connections
        self._max_connections = max_connections
        self._per_second = per_second
        self._max_wait = max_wait
        self._bucket = TokenBucket(per_second, 2 * per_second)
        self._refused = 0.0

    async def admit(self) -> str | None:
        """None once a new connection may open (past the rate, after waiting its turn, at most
        ``max_wait`` s), else why it is refused now (logged once a second at most)."""
        why = self._full()
        if why is None:
            delay = self._bucket.reserve(self._max_wait)
            if delay is None:
                why = f"over {self._per_second:g} new connections a second"
            elif delay > 0:
                await asyncio.sleep(delay)
                why = self._full()
        if why is None:
            return None
        if time.monotonic() - self._refused > 1:  # one line a second at most
            logger.warning("refusing new connections: %s", why)
        self._refused = time.monotonic()
        return why

    def _full(self) -> str | None:
        if self._open_connections() >= self._max_connections:
            return f"{self._max_connections} connections are open"
        return None


def handshake_limits(
    handler: Handler,
    open_connections: Callable[[], int] | HandshakeLimits,
    *,
    max_connections: int = 20_000,
    per_second: float = 500.0,
) -> Handler:
    """``handler`` (the Socket.IO endpoint's), answering ``503`` with ``Retry-After`` to a new
    connection's handshake (a request without a session id) when ``max_connections`` are open,
    or when past ``per_second`` handshakes a second (bursts of twice that) its turn is more than
    :data:`MAX_WAIT` s away: what a client costs before it authenticates is bounded for the
    instance as a whole, not only per connection. A wrapper of that one route rather than a
    middleware, which every request would pay for."""
    limits = (
        open_connections
        if isinstance(open_connections, HandshakeLimits)
        else HandshakeLimits(
            open_connections, max_connections=max_connections, per_second=per_second
        )
    )

    async def guarded(request: web.Request) -> web.StreamResponse:
        # the query string itself: request.query would parse it into a MultiDict that the
        # request keeps (a websocket's, for its whole life)
        query = request.query_string
        if query.startswith("sid=") or "&sid=" in query:
            return await handler(request)
        why = await limits.admit()
        if why is None:
            return await handler(request)
        raise web.HTTPServiceUnavailable(
            text=f"503: {why}: retry later", headers={hdrs.RETRY_AFTER: "1"}
        )

    return guarded


def request_timeout(timeout: float) -> web.HTTPException:
    """``408``, closing the connection: what follows on it is the rest of a body, not a request."""
    response = web.HTTPRequestTimeout(
        text=f"408: the request's body did not arrive within {timeout:g} s",
        headers={hdrs.CONNECTION: "close"},
    )
    response.force_close()
    return response


class _MalformedRequestLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger, without the raw request bytes its parse errors quote.

    aiohttp logs a malformed request (or body) as an ERROR with a traceback whose text quotes the
    offending line: an ``Authorization`` header with a stray control byte, a URL holding a token.
    Such a record becomes one INFO line naming the error's kind; any other record (the gateway's
    own failures) passes unchanged, traceback included.
    """

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        error = sys.exc_info()[1] if exc_info is True else exc_info
        if isinstance(error, tuple):
            error = error[1]
        if isinstance(error, (HttpProcessingError, web.RequestPayloadError)):
            kind = type(error.__cause__ or error).__name__
            self.logger.info("closed a connection after a malformed request (%s)", kind)
            return
        self.logger.log(level, msg, *args, **kwargs)
