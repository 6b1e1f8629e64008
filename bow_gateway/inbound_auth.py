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
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

from aiohttp import BasicAuth as Credentials
from aiohttp import hdrs, web
from yarl import URL

logger = logging.getLogger("bow_gateway.inbound")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CATCH_ALL: Final = "/"
"""The catch-all's canonical path: aiohttp tries its resources under ``/`` last."""


class BasicAuth:
    """The inbounds' credentials, checked on every route but the open ones.

    ``is_open(path)`` names the gateway's own endpoints, which need no credentials (``/health``,
    Socket.IO's, the clients' endpoints); it is checked on each request's path, as a middleware
    would, except on a route whose one path is known (open: no check; not open: the
    credentials only).
    """

    def __init__(
        self, *, realm: str, username: str, password: str, is_open: Callable[[str], bool]
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
        self._issued: set[Handler] = set()  # every handler a route got from add()
        self._sealed = False

    @property
    def header(self) -> bytes:
        """The ``Authorization`` value a client with the credentials sends (never a header's
        value when the username holds ``:``: such a client is checked by :meth:`check`)."""
        return self._header

    def check(self, request: web.Request) -> None:
        """Raise ``401`` (with the challenge) unless ``request`` has the credentials."""
        header = request.headers.get(hdrs.AUTHORIZATION, "")
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
