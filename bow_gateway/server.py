"""``Bow``: the server that wires inbounds, the backplane, the criteria indices and the outbound."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from aiohttp import web

from .backplane import Backplane, backplane_from_config
from .config import Config, load_config
from .inbound import InboundSpec, basic_auth, health_handler, message_handler
from .index import CriteriaIndex
from .message import Event, decode_event, encode_event
from .outbound import Connection, OutboundSpec, SocketOutbound, normalise_version

logger = logging.getLogger("bow_gateway")

HEALTH_PATH: Final = "/health"
SOCKETIO_PATH: Final = "/socket.io/"


class Bow:
    """One gateway instance: configure it, register versioned plugins, then ``await start()``.

    Every registration returns the same ``Bow`` so calls chain; invalid configuration raises
    ``ValueError`` naming the field, at construction or registration time.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config: Config = load_config(config)
        self.port: int | None = None
        self._middlewares: dict[str, Callable[[Any], Any]] = {}
        self._inbounds: dict[str, InboundSpec] = {}
        self._outbounds: dict[str, OutboundSpec] = {}
        self._health_check: Callable[[web.Request], Any] | None = None
        self._backplane: Backplane | None = None
        self._outbound: SocketOutbound | None = None
        self._runner: web.AppRunner | None = None
        self._consumer: asyncio.Task[None] | None = None
        self._reporter: asyncio.Task[None] | None = None

    # -- registration -----------------------------------------------------------------------

    def middleware(
        self, *, version: str, create_criteria_from_listener_details: Callable[[Any], Any]
    ) -> Bow:
        """Register how a listener's details become criteria, under a unique version."""
        key = _version("middleware", version)
        _callable("create_criteria_from_listener_details", create_criteria_from_listener_details)
        if key in self._middlewares:
            raise ValueError(f"middleware version {version!r} is already registered")
        self._middlewares[key] = create_criteria_from_listener_details
        return self

    def inbound(
        self,
        *,
        path: str,
        create_message_from_request_body: Callable[[Any], Any],
        middleware_version: str,
    ) -> Bow:
        """Register ``POST path``, whose bodies become messages resolved by a middleware version."""
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"inbound path must be a string starting with '/', not {path!r}")
        if path == HEALTH_PATH or path.startswith(SOCKETIO_PATH):
            raise ValueError(f"inbound path {path!r} is reserved by the gateway")
        if path in self._inbounds:
            raise ValueError(f"inbound path {path!r} is already registered")
        _callable("create_message_from_request_body", create_message_from_request_body)
        self._inbounds[path] = InboundSpec(
            path,
            create_message_from_request_body,
            _version("middleware_version", middleware_version),
        )
        return self

    def outbound(
        self,
        *,
        version: str,
        create_listener_details_from_token: Callable[[Any], Any],
        middleware_version: str,
    ) -> Bow:
        """Register a Socket.IO handshake version whose tokens become listener details."""
        key = _version("outbound", version)
        if key in self._outbounds:
            raise ValueError(f"outbound version {version!r} is already registered")
        _callable("create_listener_details_from_token", create_listener_details_from_token)
        self._outbounds[key] = OutboundSpec(
            key,
            create_listener_details_from_token,
            _version("middleware_version", middleware_version),
        )
        return self

    def health_check(self, decorator: Callable[[web.Request], Any]) -> Bow:
        """Let ``decorator(request)`` make the ``200`` answer of ``GET /health``."""
        _callable("health_check", decorator)
        self._health_check = decorator
        return self

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect the backplane and serve; returns once connections are accepted."""
        if self._runner is not None:
            raise RuntimeError("this Bow is already started")
        self._check_versions()
        config = self.config
        backplane = backplane_from_config(
            config.redis, namespace=config.namespace, **config.backplane
        )
        await backplane.connect()
        self._backplane = backplane

        async def publish(event: Event) -> None:
            await backplane.publish(encode_event(event))

        indices: dict[str, CriteriaIndex[Connection]] = {
            v: CriteriaIndex() for v in self._middlewares
        }
        self._outbound = outbound = SocketOutbound(
            outbounds=self._outbounds,
            middlewares=self._middlewares,
            indices=indices,
            publish=publish,
            auth_timeout=config.auth_timeout,
            max_queued_frames=config.max_queued_frames,
            transports=config.transports,
        )
        app = web.Application(
            client_max_size=config.max_body_size,
            middlewares=[
                basic_auth(
                    realm=config.realm,
                    username=config.username,
                    password=config.password,
                    is_open=lambda path: path == HEALTH_PATH or path.startswith(SOCKETIO_PATH),
                )
            ],
        )
        for spec in self._inbounds.values():
            app.router.add_post(
                spec.path, message_handler(spec, publish, timeout=config.inbound_timeout)
            )
        app.router.add_get(
            HEALTH_PATH,
            health_handler(
                lambda: backplane.ready, self._health_check, timeout=config.inbound_timeout
            ),
        )
        outbound.sio.attach(app, socketio_path=SOCKETIO_PATH.strip("/"))
        self._consumer = asyncio.create_task(self._consume(backplane, outbound))
        if config.log_interval:
            self._reporter = asyncio.create_task(self._log_listeners(config.log_interval))
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5)
        await runner.setup()
        site = web.TCPSite(
            runner,
            config.host,
            config.port,
            ssl_context=config.ssl_context(),
            reuse_port=config.reuse_port or None,
        )
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            await self._stop_backplane()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        logger.info("serving on %s:%d", config.host, self.port)

    async def stop(self) -> None:
        """Stop gracefully: refuse new messages, deliver those accepted, close every socket."""
        await self._stop_backplane()
        if self._outbound is not None:
            await self._outbound.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for function in {*self._middlewares.values(), *self._inbound_functions()}:
            close = getattr(function, "aclose", None)
            if close is not None and inspect.iscoroutinefunction(close):
                await close()

    async def _stop_backplane(self) -> None:
        backplane, self._backplane = self._backplane, None
        if backplane is not None:
            await backplane.disconnect()
        if self._reporter is not None:
            self._reporter.cancel()
            self._reporter = None
        if self._consumer is not None:
            # The backplane has ended its events: the consumer delivers what it holds, then ends.
            await self._consumer
            self._consumer = None

    def _inbound_functions(self) -> list[Callable[[Any], Any]]:
        return [
            *(spec.create_message_from_request_body for spec in self._inbounds.values()),
            *(spec.create_listener_details_from_token for spec in self._outbounds.values()),
        ]

    async def _consume(self, backplane: Backplane, outbound: SocketOutbound) -> None:
        async for data in backplane.events():
            try:
                await outbound.deliver(decode_event(data))
            except Exception:  # one bad event must not stop delivery of the next ones
                logger.exception("could not deliver an event")

    async def _log_listeners(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            if self._outbound is not None:
                logger.info(
                    "%d listeners connected (%d sockets)",
                    self._outbound.listener_count(),
                    len(self._outbound.connections),
                )

    def _check_versions(self) -> None:
        specs: list[InboundSpec | OutboundSpec] = [
            *self._inbounds.values(),
            *self._outbounds.values(),
        ]
        for spec in specs:
            if spec.middleware_version not in self._middlewares:
                what = (
                    f"inbound {spec.path!r}"
                    if isinstance(spec, InboundSpec)
                    else f"outbound v{spec.version}"
                )
                raise ValueError(
                    f"{what} names middleware version {spec.middleware_version!r}, "
                    "which is not registered"
                )


def _version(field: str, version: Any) -> str:
    if not isinstance(version, str) or not normalise_version(version):
        raise ValueError(f"{field} must be a non-empty string, not {version!r}")
    return normalise_version(version)


def _callable(field: str, function: Any) -> None:
    if not callable(function):
        raise ValueError(f"{field} must be callable, not {type(function).__name__}")
