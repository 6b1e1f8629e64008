"""The gateway's web application: the inbounds, the control endpoints, ``/health``,
``/metrics``, and the outbounds' Socket.IO and Server-Sent Events endpoints with their limits."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

from aiohttp import web

from .backplanes import Backplane
from .config import Config
from .control import Control
from .http_server import HandshakeLimits, handshake_limits
from .inbound import Enrich, basic_auth, health_handler, message_handler
from .message import Event, encode_event
from .metrics import Metrics
from .outbound import SocketOutbound
from .outbound.sse import SseEndpoint
from .plugins import HealthCheck, InboundPlugin

HEALTH_PATH: Final = "/health"
SOCKETIO_PATH: Final = "/socket.io/"
METRICS_PATH: Final = "/metrics"


def build_app(
    config: Config,
    *,
    inbounds: Mapping[str, InboundPlugin],
    outbound: SocketOutbound,
    backplane: Backplane,
    control: Control,
    metrics: Metrics,
    enrich: Enrich | None,
    health_check: HealthCheck | None,
    serving: Callable[[], bool],
) -> web.Application:
    """Every route, behind the inbounds' Basic Auth but for the endpoints clients use."""
    open_paths = {HEALTH_PATH}
    if config.sse_path is not None:
        open_paths.add(config.sse_path)  # a listener's token, not the inbound's credentials
    if config.metrics_port is None and not config.metrics_auth:
        open_paths.add(METRICS_PATH)
    app = web.Application(
        client_max_size=config.max_body_size,
        middlewares=[
            basic_auth(
                realm=config.realm,
                username=config.username,
                password=config.password,
                is_open=lambda path: path in open_paths or path.startswith(SOCKETIO_PATH),
            ),
        ],
    )

    async def publish_many(events: Sequence[Event]) -> list[str]:
        return await backplane.publish_many([encode_event(event) for event in events])

    for spec in inbounds.values():
        handler = message_handler(
            spec,
            publish_many,
            metrics,
            enrich=enrich,
            timeout=config.inbound_timeout,
            max_queries=config.max_queries,
            max_predicates=config.max_predicates,
            max_event_bytes=config.max_event_bytes,
            max_batch=config.inbound_max_batch,
        )
        app.router.add_post(spec.path, handler)
    control.add_routes(app, inbounds)
    app.router.add_get(
        HEALTH_PATH, health_handler(serving, health_check, timeout=config.inbound_timeout)
    )
    if config.metrics_port is None:
        app.router.add_get(METRICS_PATH, metrics.handle)
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
        app.router.add_route(method, SOCKETIO_PATH, socketio_handler)
    if config.sse_path is not None:
        sse = SseEndpoint(outbound, limits, cors_origins=config.cors_origins)
        app.router.add_get(config.sse_path, sse.handle)
    return app
