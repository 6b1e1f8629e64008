"""How the gateway's HTTP server bounds clients that stall and quiets those that send garbage.

aiohttp offers most of it, through public keyword arguments of ``web.AppRunner``: its keep-alive
timer closes a connection whose next request's headers have not all arrived in time (the timer
runs from the connection's start, and from the end of each response), ``lingering_time`` bounds
how long a body nobody reads is drained, and ``logger`` replaces the logger that reports malformed
requests. A body the gateway waits for is bounded where it is read (the inbound's handler, a
long-polling POST); :func:`handshake_limits` bounds new connections. No private API is used.
"""

from __future__ import annotations

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


class HandshakeLimits:
    """``outbound.max_sockets`` and ``outbound.max_connects_per_second`` for an instance as a
    whole: every endpoint that opens a connection (Socket.IO, SSE) shares one bucket."""

    def __init__(
        self,
        open_connections: Callable[[], int],
        *,
        max_connections: int = 20_000,
        per_second: float = 500.0,
    ) -> None:
        self._open_connections = open_connections
        self._max_connections = max_connections
        self._per_second = per_second
        self._bucket = TokenBucket(per_second, 2 * per_second)
        self._refused = 0.0

    def refusal(self) -> str | None:
        """Why a new connection is refused now (logged once a second at most), or None."""
        if self._open_connections() >= self._max_connections:
            why = f"{self._max_connections} connections are open"
        elif not self._bucket.take():
            why = f"over {self._per_second:g} new connections a second"
        else:
            return None
        if time.monotonic() - self._refused > 1:  # one line a second at most
            logger.warning("refusing new connections: %s", why)
        self._refused = time.monotonic()
        return why


def handshake_limits(
    handler: Handler,
    open_connections: Callable[[], int] | HandshakeLimits,
    *,
    max_connections: int = 20_000,
    per_second: float = 500.0,
) -> Handler:
    """``handler`` (the Socket.IO endpoint's), answering ``503`` with ``Retry-After`` to a new
    connection's handshake (a request without a session id) when ``max_connections`` are open,
    or past ``per_second`` handshakes a second (bursts of twice that): what a client costs before
    it authenticates is bounded for the instance as a whole, not only per connection. A wrapper
    of that one route rather than a middleware, which every request would pay for."""
    limits = (
        open_connections
        if isinstance(open_connections, HandshakeLimits)
        else HandshakeLimits(
            open_connections, max_connections=max_connections, per_second=per_second
        )
    )

    async def guarded(request: web.Request) -> web.StreamResponse:
        if "sid" in request.query:
            return await handler(request)
        why = limits.refusal()
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
