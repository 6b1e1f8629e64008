"""The gateway's web application: the inbounds, the control endpoints, ``/health``,
``/metrics``, and the outbounds' Socket.IO, Server-Sent Events and Flywheel endpoints with their
limits."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from aiohttp import web

from ..backplanes import Backplane
from ..connectors.webpush import WebPush
from ..core.plugins import HealthCheck, InboundPlugin
from ..ingress.control import Control, check_inbound_paths
from ..ingress.http_fast_path import FastRoute
from ..ingress.inbound import Enrich, Handler, health_handler, message_handler
from ..ingress.inbound_auth import BasicAuth
from ..ingress.publisher import Publisher
from ..ingress.push_subscriptions import add_push_subscription_routes
from ..ingress.webhooks_control import add_webhook_routes
from ..outbound import SocketOutbound
from ..outbound.protocols import registered
from ..runtime.config import Config
from ..runtime.http_server import HandshakeLimits, handshake_limits
from ..runtime.metrics import Metrics
from ..webhooks import Webhooks

HEALTH_PATH: Final = "/health"
SOCKETIO_PATH: Final = "/socket.io/"
METRICS_PATH: Final = "/metrics"


def build_app(
    config: Config,
    *,
    inbounds: Mapping[str, InboundPlugin],
    outbound: SocketOutbound,
    backplane: Backplane,
    publisher: Publisher,
    control: Control,
    metrics: Metrics,
    enrich: Enrich | None,
    health_check: HealthCheck | None,
    serving: Callable[[], bool],
    webhooks: Webhooks | None = None,
) -> tuple[web.Application, dict[bytes, FastRoute]]:
    """Every route, behind the inbounds' Basic Auth (:mod:`bow_gateway.ingress.inbound_auth`) but
    for the endpoints clients use; and the plain JSON inbounds, for the fast path
    (:mod:`bow_gateway.ingress.http_fast_path`)."""
    open_paths = _open_paths(config, inbounds)
    app = web.Application(client_max_size=config.max_body_size)
    auth = BasicAuth(
        realm=config.realm,
        username=config.username,
        password=config.password,
        is_open=lambda path: path in open_paths or path.startswith(SOCKETIO_PATH),
        max_failures_per_minute=config.max_auth_failures_per_minute,
    )
    fast = _add_inbounds(app, auth, config, inbounds, publisher, metrics, enrich)
    control.add_routes(
        lambda path, handler: auth.add(app, "POST", path, handler),
        inbounds,
        lambda path, handler: auth.add(app, "GET", path, handler),
    )
    if webhooks is not None:  # GET .../webhooks/dead, POST .../webhooks/replay (section 19)
        add = lambda method, path, handler: auth.add(app, method, path, handler)  # noqa: E731
        add_webhook_routes(webhooks, config.api_prefix, config.inbound_timeout, add)
        for connector in webhooks.connectors:  # .../push-subscriptions (section 20)
            if isinstance(connector, WebPush):
                subscriptions = connector.subscriptions
                add_push_subscription_routes(
                    subscriptions, config.api_prefix, config.inbound_timeout, add
                )
    health = health_handler(serving, health_check, timeout=config.inbound_timeout)
    auth.add(app, "GET", HEALTH_PATH, health)
    if config.metrics_port is None:
        auth.add(app, "GET", METRICS_PATH, metrics.handle)
    _add_outbound(app, auth, config, outbound)
    auth.seal(app)  # the catch-all route; no route without credentials but the open ones
    return app, fast


def _open_paths(config: Config, inbounds: Mapping[str, InboundPlugin]) -> set[str]:
    """The paths served without the inbounds' credentials."""
    open_paths = {HEALTH_PATH}
    # The clients' endpoints take a listener's token, not the inbounds' credentials
    client_paths = [path for path in config.endpoint_paths.values() if path is not None]
    for path in client_paths:
        if path in inbounds:
            raise ValueError(f"inbound path {path!r} is an outbound endpoint's (outbound.*_path)")
        open_paths.add(path)
    if config.metrics_port is None and not config.metrics_auth:
        open_paths.add(METRICS_PATH)
    return open_paths


def _add_inbounds(
    app: web.Application,
    auth: BasicAuth,
    config: Config,
    inbounds: Mapping[str, InboundPlugin],
    publisher: Publisher,
    metrics: Metrics,
    enrich: Enrich | None,
) -> dict[bytes, FastRoute]:
    """Every inbound's route; the plain JSON ones, for the fast path."""
    fast: dict[bytes, FastRoute] = {}
    for spec in inbounds.values():
        plain = "{" not in spec.path
        handler, accept_json = message_handler(
            spec,
            publisher.positions,
            metrics,
            enrich=enrich,
            timeout=config.inbound_timeout,
            max_queries=config.max_queries,
            max_predicates=config.max_predicates,
            max_event_bytes=config.max_event_bytes,
            max_batch=config.inbound_max_batch,
            idempotency_window=config.idempotency_window,
            check=auth.check if plain else None,  # the hot path: no layer of its own
        )
        if not plain:  # a parameter may match a path the gateway keeps for itself
            handler = _not_on(handler, _gateway_path(config))
        elif accept_json is not None:
            fast[spec.path.encode()] = FastRoute(accept_json, auth.header, auth.attempts)
        auth.add(app, "POST", spec.path, handler, checks_itself=plain)
    return fast


def _add_outbound(
    app: web.Application, auth: BasicAuth, config: Config, outbound: SocketOutbound
) -> None:
    """Socket.IO's routes and every registered client protocol's endpoint
    (:mod:`bow_gateway.outbound.registry`), under the handshake limits."""
    # python-socketio's attach(), with the handshake limits around its handler; an SSE
    # stream is a new connection too, under the same limits
    limits = HandshakeLimits(
        lambda: outbound.open_connections,
        max_connections=config.max_sockets,
        per_second=config.max_connects_per_second,
    )
    # engineio's handler, not python-socketio's, which only awaits it: a websocket keeps every
    # coroutine frame of its request's handlers for its whole life
    socketio_handler = handshake_limits(outbound.sio.eio.handle_request, limits)
    for method in ("GET", "POST", "OPTIONS"):
        auth.add(app, method, SOCKETIO_PATH, socketio_handler, allow_head=False)
    for name, protocol in registered().items():
        path = config.endpoint_paths.get(name)
        if path is not None:
            auth.add(app, "GET", path, protocol.endpoint(outbound, limits, config))


def check_inbound(path: Any, api_prefix: str, body_function: Any, request_function: Any) -> None:
    """``ValueError`` for an inbound that ``Bow.inbound`` cannot register: a path that is not a
    route (a malformed ``{parameter}``) or is the gateway's; not exactly one callable function."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"inbound path must be a string starting with '/', not {path!r}")
    if path == HEALTH_PATH or path.startswith(SOCKETIO_PATH):
        raise ValueError(f"inbound path {path!r} is reserved by the gateway")
    check_inbound_paths([path], api_prefix)
    try:
        web.UrlDispatcher().add_post(path, _never)
    except ValueError as error:
        raise ValueError(f"inbound path {path!r} is not a valid route: {error}") from None
    if (body_function is None) == (request_function is None):
        raise ValueError(
            f"inbound {path!r}: give exactly one of create_message_from_request_body (the "
            "JSON body to a message) and create_message_from_request (the request to one)"
        )
    name = "create_message_from_request" + ("_body" if request_function is None else "")
    function = body_function if request_function is None else request_function
    if not callable(function):
        raise ValueError(f"{name} must be callable, not {type(function).__name__}")


async def _never(request: web.Request) -> Any:
    raise AssertionError("only ever checked, never served")


def _gateway_path(config: Config) -> Callable[[str], bool]:
    """Whether a path is the gateway's own: open ones (``/health``, Socket.IO, the clients'
    endpoints) or under ``api.prefix``."""
    clients = config.endpoint_paths.values()
    own = {HEALTH_PATH, METRICS_PATH, *(path for path in clients if path)}
    prefix = config.api_prefix
    return lambda path: (
        path in own
        or path.startswith(SOCKETIO_PATH)
        or path == prefix
        or path.startswith(prefix + "/")
    )


def _not_on(handler: Handler, gateway_path: Callable[[str], bool]) -> Handler:
    """``handler``, but ``404`` for the gateway's own paths: a parameterised inbound path
    (``/{topic:.+}``) matches them when their own route does not take the method, and an open
    one would reach the inbound's function without credentials."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        if gateway_path(request.path):
            raise web.HTTPNotFound()
        return await handler(request)

    return guarded
