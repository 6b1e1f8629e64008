"""The webhooks' control endpoints (contract section 19), behind the inbounds' Basic Auth as the
others: ``GET {api.prefix}/webhooks/dead?limit=N`` lists the oldest dead letters,
``POST {api.prefix}/webhooks/replay`` with ``{"ids": [...]}`` queues them again."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..backplanes import BackplaneUnavailable
from ..core.message import dumps
from ..webhooks import Webhooks
from .accepted import unavailable, unprocessable
from .inbound import read_json

logger = logging.getLogger("bow_gateway.control")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
AddRoute = Callable[[str, str, Handler], None]


def add_webhook_routes(webhooks: Webhooks, prefix: str, timeout: float, add: AddRoute) -> None:
    """Both endpoints, each through ``add(method, path, handler)`` (behind the credentials);
    another method on their paths is ``405``."""

    async def dead(request: web.Request) -> web.StreamResponse:
        text = request.query.get("limit", "100")
        limit = int(text) if text.isdigit() and len(text) < 7 else -1
        return await _answer(request, lambda: webhooks.dead(limit), "dead")

    async def replay(request: web.Request) -> web.StreamResponse:
        body = await read_json(request, timeout)
        if not isinstance(body, dict) or set(body) != {"ids"}:
            raise unprocessable('the body must be {"ids": [webhook-id, ...]}')
        return await _answer(request, lambda: webhooks.replay(body["ids"]), "replayed")

    add("GET", f"{prefix}/webhooks/dead", dead)
    add("POST", f"{prefix}/webhooks/replay", replay)


async def _answer(
    request: web.Request, operation: Callable[[], Awaitable[Any]], name: str
) -> web.Response:
    """``{name: result}``; 422 for a ``ValueError``, 503 when the store is out of reach."""
    try:
        result = await operation()
    except ValueError as error:
        logger.info("refused %s %s: %s", request.method, request.path, error)
        raise unprocessable(str(error)) from None
    except BackplaneUnavailable as error:
        logger.warning("refused %s %s: %s", request.method, request.path, error)
        raise unavailable(error.retry_after) from error
    return web.Response(body=dumps({name: result}), content_type="application/json")
