"""The inbounds' Basic Auth, route by route: every request but those to the gateway's open
endpoints is answered ``401`` without the credentials, whatever its path (so that no one learns
which paths exist), before any ``404`` or ``405``.

Per route rather than as an aiohttp middleware: an app with a middleware has aiohttp wrap every
request's handler in a layer of its own (a cached lookup, a ``partial`` and the middleware's
coroutine a request; a frame kept for every websocket's life). Every route goes through
:meth:`BasicAuth.add`; a catch-all route answers what no route takes (``401``, then ``404`` or
``405``), and :meth:`BasicAuth.seal` refuses an app holding a route that did not go through
:meth:`BasicAuth.add`.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

from aiohttp import BasicAuth as Credentials
from aiohttp import hdrs, web
from yarl import URL

from ..runtime.ratelimit import TokenBucket

logger = logging.getLogger("bow_gateway.inbound")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MAX_ADDRESSES: Final = 10_000
"""Client addresses whose failed attempts are counted at once (the least recent forgotten)."""

CATCH_ALL: Final = "/"
"""The catch-all's canonical path: aiohttp tries its resources under ``/`` last."""


def client_address(peername: Any) -> str:
    """The key of a client's failed attempts: its IP address (an IPv6 one's /64, which one
    host commonly holds whole), "" for a peer without one (a Unix socket)."""
    if not isinstance(peername, (list, tuple)) or not peername:
        return ""
    address = str(peername[0])
    if ":" not in address:
        return address
    try:
        ip = ipaddress.IPv6Address(address.partition("%")[0])
    except ValueError:
        return address
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return ip.exploded[:19]  # the first four groups: the /64


class FailedAttempts:
    """Failed Basic Auth attempts per client address: a token bucket each (``per_minute``,
    the first included, then ``per_minute`` a minute), for at most :data:`MAX_ADDRESSES`
    addresses, the least recently failing forgotten first. An address past its bucket is
    *blocked* until the bucket has a token again: every request it sends for a protected route
    is then ``429``, good credentials or not (else guessing would go on at full speed, the
    right password told apart by its answer). Requests with the credentials never spend a
    token, and cost one test of an empty :attr:`blocked` while no address is blocked."""

    __slots__ = ("_buckets", "_burst", "_rate", "_swept", "blocked", "per_minute")

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._rate = per_minute / 60
        self._burst = float(per_minute)
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self.blocked: dict[str, float] = {}  # address: monotonic time its block ends
        self._swept = 0.0  # when the blocks that ended were last dropped

    def retry_after(self, address: str) -> float | None:
        """Seconds ``address`` stays blocked, or None when it is not (asked only while some
        address is: the blocks that ended are dropped once a second, so that requests are
        back to one test of an empty :attr:`blocked` soon after the last ends)."""
        now = time.monotonic()
        if now >= self._swept + 1.0:
            self._swept = now
            for ended in [key for key, until in self.blocked.items() if until <= now]:
                del self.blocked[ended]
        until = self.blocked.get(address)
        if until is None or until <= now:
            return None
        return until - now

    def failed(self, address: str) -> float | None:
        """Count a failed attempt of ``address``: None while it is within its bucket, else the
        seconds it is now blocked for."""
        buckets = self._buckets
        bucket = buckets.get(address)
        if bucket is None:
            if len(buckets) >= MAX_ADDRESSES:
                forgotten, _ = buckets.popitem(last=False)
                self.blocked.pop(forgotten, None)
            bucket = buckets[address] = TokenBucket(self._rate, self._burst)
        else:
            buckets.move_to_end(address)
        if bucket.take():
            return None
        wait = bucket.delay()
        self.blocked[address] = time.monotonic() + wait
        return wait


class BasicAuth:
    """The inbounds' credentials, checked on every route but the open ones.

    ``is_open(path)`` names the gateway's own endpoints, which need no credentials (``/health``,
    Socket.IO's, the clients' endpoints); it is checked on each request's path, as a middleware
    would, except on a route whose one path is known (open: no check; not open: the
    credentials only).
    """

    def __init__(
        self,
        *,
        realm: str,
        username: str,
        password: str,
        is_open: Callable[[str], bool],
        max_failures_per_minute: int = 60,
    ) -> None:
        self._user = username.encode()
        self._password = password.encode()
        # What a client sends for these credentials, compared whole first: no decoding per
        # request (not for a username holding ':', which the decoding never matches: it splits
        # there)
        header = b"Basic " + base64.b64encode(self._user + b":" + self._password)
        self._header = b"\0" if b":" in self._user else header  # no header value holds a NUL
        self._challenge = 'Basic realm="{}"'.format(realm.replace("\\", "\\\\").replace('"', '\\"'))
        self._is_open = is_open
        # Failed attempts per client address (the inbounds' fast path reads it too)
        self.attempts = FailedAttempts(max_failures_per_minute)
        self._issued: set[Handler] = set()  # every handler a route got from add()
        self._sealed = False

    @property
    def header(self) -> bytes:
        """The ``Authorization`` value a client with the credentials sends (never a header's
        value when the username holds ``:``: such a client is checked by :meth:`check`)."""
        return self._header

    def check(self, request: web.Request) -> None:
        """Raise ``401`` (with the challenge) unless ``request`` has the credentials; ``429``
        (with ``Retry-After``) while its address is blocked for too many failed attempts."""
        header = request.headers.get(hdrs.AUTHORIZATION, "")
        attempts = self.attempts
        if attempts.blocked:  # rarely: one test of an empty dict otherwise
            wait = attempts.retry_after(client_address(_peername(request)))
            if wait is not None:
                raise _too_many(wait)
        if hmac.compare_digest(header.encode("utf-8", "surrogateescape"), self._header):
            return
        try:
            credentials = Credentials.decode(header, encoding="utf-8")
        except ValueError:
            credentials = None
        # Both comparisons always run, in constant time, so timing tells nothing.
        user_ok = hmac.compare_digest(
            (credentials.login if credentials else "").encode(), self._user
        )
        password_ok = hmac.compare_digest(
            (credentials.password if credentials else "").encode(), self._password
        )
        if not (credentials and user_ok and password_ok):
            reason = "wrong credentials" if credentials else "no Basic credentials"
            # Only a guess counts: a request without credentials (a browser's first, a probe)
            # cannot find the password
            address = client_address(_peername(request))
            wait = attempts.failed(address) if credentials else None
            if wait is not None:  # logged once per block: its requests until then are not
                logger.warning(
                    "refused %s %s: %s; %s blocked for %.1f s (over %g failed attempts a minute)",
                    request.method,
                    request.path,
                    reason,
                    address or "a client without an address",
                    wait,
                    attempts.per_minute,
                )
                raise _too_many(wait)
            logger.info("refused %s %s: %s", request.method, request.path, reason)
            raise web.HTTPUnauthorized(
                text=f"401: {reason}", headers={hdrs.WWW_AUTHENTICATE: self._challenge}
            )

    def add(
        self,
        app: web.Application,
        method: str,
        path: str,
        handler: Handler,
        *,
        checks_itself: bool = False,
        allow_head: bool = True,
    ) -> None:
        """Route ``method`` on ``path`` to ``handler`` behind the credentials (``GET`` also
        takes ``HEAD`` unless not ``allow_head``, as ``add_get``). ``checks_itself``:
        ``handler`` calls :meth:`check` first itself (the inbound's, saving a layer), valid only
        for a path without parameters that is not open."""
        routed = self._routed(method, path, handler, checks_itself)
        if method == hdrs.METH_GET:
            app.router.add_get(path, routed, allow_head=allow_head)
        else:
            app.router.add_route(method, path, routed)

    def _routed(self, method: str, path: str, handler: Handler, checks_itself: bool) -> Handler:
        if self._sealed:
            raise RuntimeError(f"route {method} {path} added after the routes were sealed")
        plain = "{" not in path
        if checks_itself and not (plain and not self._is_open(path)):
            raise ValueError(f"{path!r}: only a plain protected path's handler checks itself")
        if checks_itself or (plain and self._is_open(path)):
            routed = handler
        elif plain:
            routed = self._protected(handler)
        else:  # a parameter may match an open path: checked on each request's, as before
            routed = self._guarded(handler)
        self._issued.add(routed)
        return routed

    def seal(self, app: web.Application) -> None:
        """Add the catch-all route, then refuse (``RuntimeError``) an app holding a route that
        did not come from :meth:`add`: it would answer without credentials."""
        # any path, "*" too (which no route's path can match), its own open or not on each request
        catch_all = _CatchAll()
        catch_all.route(self._routed(hdrs.METH_ANY, "/{any}", catch_all.answer, False))
        app.router.register_resource(catch_all)
        self._sealed = True
        for route in app.router.routes():
            if route.handler not in self._issued:
                raise RuntimeError(
                    f"route {route.method} {route.resource and route.resource.canonical} "
                    "is not behind the inbounds' Basic Auth: add it through BasicAuth.add"
                )

    def _protected(self, handler: Handler) -> Handler:
        check = self.check

        async def protected(request: web.Request) -> web.StreamResponse:
            check(request)
            return await handler(request)

        return protected

    def _guarded(self, handler: Handler) -> Handler:
        check, is_open = self.check, self._is_open

        async def guarded(request: web.Request) -> web.StreamResponse:
            if not is_open(request.path):
                check(request)
            return await handler(request)

        return guarded


def _peername(request: web.Request) -> Any:
    transport = request.transport
    return None if transport is None else transport.get_extra_info("peername")


def _too_many(wait: float) -> web.HTTPTooManyRequests:
    seconds = max(1, math.ceil(wait))
    return web.HTTPTooManyRequests(
        text=f"429: too many failed attempts: retry after {seconds} s",
        headers={hdrs.RETRY_AFTER: str(seconds)},
    )


class _CatchAll(web.AbstractResource):
    """The last resource: takes every request no other took, whatever its path."""

    def __init__(self) -> None:
        super().__init__()
        self._routes: list[web.ResourceRoute] = []

    def route(self, handler: Handler) -> None:
        self._routes.append(web.ResourceRoute(hdrs.METH_ANY, handler, self))

    async def answer(self, request: web.Request) -> web.StreamResponse:
        """``405`` naming the methods of the routes the path matches, else ``404``, as
        aiohttp's router answers (the credentials checked first)."""
        allowed: set[str] = set()
        for resource in request.app.router.resources():
            if resource is not self:
                allowed |= (await resource.resolve(request))[1]
        if allowed:
            raise web.HTTPMethodNotAllowed(request.method, allowed)
        raise web.HTTPNotFound()

    @property
    def canonical(self) -> str:
        return CATCH_ALL

    def url_for(self, **kwargs: str) -> URL:
        return URL(CATCH_ALL)

    async def resolve(self, request: web.Request) -> tuple[web.UrlMappingMatchInfo, set[str]]:
        return web.UrlMappingMatchInfo({}, self._routes[0]), set()

    def add_prefix(self, prefix: str) -> None:
        raise NotImplementedError("the catch-all is not for a sub-application")

    def get_info(self) -> Any:  # aiohttp's private TypedDict: nothing to tell
        return {}

    def raw_match(self, path: str) -> bool:
        return False  # never a resource that add_route reuses

    def __len__(self) -> int:
        return len(self._routes)

    def __iter__(self) -> Iterator[web.ResourceRoute]:
        return iter(self._routes)
