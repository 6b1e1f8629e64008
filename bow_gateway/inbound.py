"""The HTTP inbound: Basic Auth first, then ``POST {path}`` turns a JSON body into a message.

Statuses, as the contract says: 401 without valid credentials (whatever the path, so that no one
learns which paths exist), then 404, 405, 413, 422, 503 (with ``Retry-After``), and 204 once the
message is on the backplane.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import BasicAuth, hdrs, web
from aiohttp.typedefs import Middleware

from .backplane import BackplaneUnavailable
from .message import Event, MessageEvent, parse_json, validate_message
from .metrics import Metrics
from .userfn import call_user_function, describe

logger = logging.getLogger("bow_gateway.inbound")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class InboundSpec:
    """A registered inbound: its path, how a body becomes a message, its middleware version."""

    path: str
    create_message_from_request_body: Callable[[Any], Any]
    middleware_version: str


def basic_auth(
    *, realm: str, username: str, password: str, is_open: Callable[[str], bool]
) -> Middleware:
    """An aiohttp middleware that answers 401 to every request without the credentials.

    ``is_open(path)`` names the gateway's own endpoints, which need no credentials.
    """
    expected_user = username.encode()
    expected_password = password.encode()
    challenge = 'Basic realm="{}"'.format(realm.replace("\\", "\\\\").replace('"', '\\"'))

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_open(request.path):
            return await handler(request)
        header = request.headers.get(hdrs.AUTHORIZATION, "")
        try:
            credentials = BasicAuth.decode(header, encoding="utf-8")
        except ValueError:
            credentials = None
        # Both comparisons always run, in constant time, so timing tells nothing.
        user_ok = hmac.compare_digest(
            (credentials.login if credentials else "").encode(), expected_user
        )
        password_ok = hmac.compare_digest(
            (credentials.password if credentials else "").encode(), expected_password
        )
        if not (credentials and user_ok and password_ok):
            reason = "wrong credentials" if credentials else "no Basic credentials"
            logger.info("refused %s %s: %s", request.method, request.path, reason)
            raise web.HTTPUnauthorized(
                text=f"401: {reason}", headers={hdrs.WWW_AUTHENTICATE: challenge}
            )
        return await handler(request)

    return middleware


def message_handler(
    inbound: InboundSpec,
    publish: Callable[[Event], Awaitable[None]],
    metrics: Metrics,
    *,
    timeout: float = 5.0,
) -> Handler:
    """The aiohttp handler of one inbound path."""
    create_message = inbound.create_message_from_request_body
    middleware_version = inbound.middleware_version
    accepted = metrics.messages_accepted.labels(inbound.path)

    async def counted(request: web.Request) -> web.StreamResponse:
        try:
            response = await handle(request)
        except web.HTTPException as error:
            metrics.messages_refused.labels(inbound.path, str(error.status)).inc()
            level = logging.WARNING if error.status >= 500 else logging.INFO
            logger.log(level, "refused %s %s: %s", request.method, request.path, error.text)
            raise
        accepted.inc()
        return response

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()  # aiohttp answers 413 past client_max_size
        if not body.strip():
            raise _unprocessable("the request has no body: send a JSON message")
        try:
            document = parse_json(body)
        except ValueError as error:
            raise _unprocessable(f"the body is not JSON: {error}") from None
        try:
            raw = await call_user_function(create_message, document, timeout)
        except TimeoutError:
            reason = f"{describe(create_message)} did not answer within {timeout:g} s"
            raise _unavailable(reason, 1) from None
        except Exception as error:  # noqa: BLE001 - the user's function refused the body
            raise _unprocessable(f"the body was refused: {error}") from None
        try:
            message = validate_message(raw)
        except ValueError as error:
            raise _unprocessable(f"invalid message: {error}") from None
        try:
            await publish(MessageEvent(middleware_version, message, time.time()))
        except ValueError as error:  # the user's message_fn made a payload JSON cannot hold
            raise _unprocessable(f"invalid message: the payload is {error}") from None
        except BackplaneUnavailable as error:
            reason = f"the gateway cannot take messages now: {error}"
            raise _unavailable(reason, error.retry_after) from None
        return web.Response(status=204)

    return counted


def _unprocessable(reason: str) -> web.HTTPException:
    return web.HTTPUnprocessableEntity(text=f"422: {reason}")


def _unavailable(reason: str, retry_after: float) -> web.HTTPException:
    return web.HTTPServiceUnavailable(
        text=f"503: {reason}", headers={hdrs.RETRY_AFTER: str(max(1, round(retry_after)))}
    )


def health_handler(
    is_ready: Callable[[], bool],
    decorator: Callable[[web.Request], Any] | None,
    *,
    timeout: float = 5.0,
) -> Handler:
    """``GET /health``: 200, empty or made by ``decorator``; 503 while the instance cannot serve."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if not is_ready():
            return web.Response(status=503, text="503: the backplane is not reachable")
        if decorator is None:
            return web.Response(status=200)
        try:
            result = await call_user_function(decorator, request, timeout)
        except Exception as error:  # noqa: BLE001 - a failing health check means unhealthy
            logger.warning("the health check raised: %s", error)
            return web.Response(status=503, text=f"503: the health check failed: {error}")
        if isinstance(result, web.StreamResponse):
            return result
        return web.json_response(result)

    return handle
