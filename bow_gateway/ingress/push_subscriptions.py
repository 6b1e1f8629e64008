"""The Web Push connector's control endpoints (contract section 20), behind the inbounds' Basic
Auth as the others: ``POST {api.prefix}/push-subscriptions`` with ``{"id", "subscription"}``
stores a browser's subscription for a listener; ``DELETE`` with ``{"endpoint"}``, ``{"id",
"endpoint"}`` or ``{"id"}`` removes subscriptions."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..backplanes import BackplaneUnavailable
from ..connectors.webpush import Subscriptions
from ..core.message import dumps
from .accepted import unavailable, unprocessable
from .inbound import read_json
from .webhooks_control import AddRoute

logger = logging.getLogger("bow_gateway.control")


def add_push_subscription_routes(
    subscriptions: Subscriptions, prefix: str, timeout: float, add: AddRoute
) -> None:
    """Both methods on ``{prefix}/push-subscriptions``, through ``add(method, path, handler)``
    (behind the credentials): ``200`` with what was done, ``422`` naming what is wrong, ``503``
    when Redis is out of reach."""
    path = f"{prefix}/push-subscriptions"

    async def subscribe(request: web.Request) -> web.StreamResponse:
        body = await read_json(request, timeout)
        return await _answer(request, lambda: subscriptions.subscribe(body))

    async def unsubscribe(request: web.Request) -> web.StreamResponse:
        body = await read_json(request, timeout)
        return await _answer(request, lambda: subscriptions.unsubscribe(body))

    add("POST", path, subscribe)
    add("DELETE", path, unsubscribe)


async def _answer(
    request: web.Request, operation: Callable[[], Awaitable[dict[str, Any]]]
) -> web.Response:
    """The operation's result as JSON; 422 for a ``ValueError`` (the endpoint never logged: it
    is a capability), 503 when the store is out of reach."""
    try:
        result = await operation()
    except ValueError as error:
        logger.info("refused %s %s: %s", request.method, request.path, error)
        raise unprocessable(str(error)) from None
    except BackplaneUnavailable as error:
        logger.warning("refused %s %s: %s", request.method, request.path, error)
        raise unavailable(error.retry_after) from error
    return web.Response(body=dumps(result), content_type="application/json")
