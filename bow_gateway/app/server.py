"""``Bow``: the server that wires inbounds, the backplane, the criteria indices and the outbound."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from functools import partial
from typing import Any, Final

from aiohttp import web

from ..backplanes import Backplane, backplane_from_config
from ..core.criteria import ID_KEY, ListenerId, validate_criteria
from ..core.enrichers import Enrichers
from ..core.history import History
from ..core.index import CriteriaIndex
from ..core.message import Event, encode_event
from ..core.plugins import (
    AsyncClosable,
    CreateCriteriaFromListenerDetails,
    CreateListenerDetailsFromToken,
    CreateMessageFromPublish,
    CreateMessageFromRequest,
    CreateMessageFromRequestBody,
    Enrich,
    EnrichInit,
    HealthCheck,
    InboundPlugin,
    OutboundPlugin,
    WatchesCriteria,
)
from ..core.retention import Retentions
from ..ingress.control import Control
from ..ingress.http_fast_path import FastPathServer, FastRoute
from ..ingress.publisher import Publisher
from ..outbound import Settings, SocketOutbound, normalise_version
from ..outbound.consumer import Consumer
from ..outbound.publishing import ClientPublish
from ..outbound.topic_replay import TopicHistory
from ..runtime.config import Config, load_config
from ..runtime.gc_freeze import (
    freeze_after_connects,
    raise_young_threshold,
    release_closed_transports,
    restore_young_threshold,
)
from ..runtime.http_server import app_runner
from ..runtime.metrics import Metrics
from ..runtime.supervisor import Supervisor
from .routes import METRICS_PATH, build_app, check_inbound

logger = logging.getLogger("bow_gateway")

CONSUMER: Final = "backplane consumer"
"""The supervised task that delivers what the backplane carries: ``/health`` is 503 while it is
down."""


class Bow:
    """One gateway instance: configure it, register versioned plugins, then ``await start()``.

    Every registration returns the same ``Bow`` so calls chain; invalid configuration raises
    ``ValueError`` naming the field, at construction or registration time.
    """

    def __init__(self, config: Mapping[str, Any], *, backplane: Backplane | None = None) -> None:
        """``backplane``: one of your own; by default, the one the ``redis`` setting names."""
        self.config: Config = load_config(config)
        self._own_backplane = backplane
        self.port: int | None = None
        # Keyed by normalise_version(version), so that "v1" and "1" match; the names as configured
        # (the specs' version, these) are what errors, logs and metric labels show.
        self._middlewares: dict[str, CreateCriteriaFromListenerDetails] = {}
        self._middleware_names: dict[str, str] = {}
        self._middleware_references: list[tuple[str, str]] = []  # (who, middleware version)
        self._inbounds: dict[str, InboundPlugin] = {}
        self._outbounds: dict[str, OutboundPlugin] = {}
        self._health_check: HealthCheck | None = None
        self._backplane: Backplane | None = None
        self._outbound: SocketOutbound | None = None
        self._runners: list[web.AppRunner] = []
        self._young_raised = False  # gc's young threshold, until stop() puts it back
        self._fast_paths: list[tuple[FastPathServer, asyncio.Server]] = []
        self._stopping = False
        self.metrics = Metrics()
        self.metrics_port: int | None = None
        self._supervisor = Supervisor(
            on_restart=lambda name: self.metrics.task_restarts.labels(name).inc()
        )
        self._consumer: asyncio.Task[None] | None = None
        self._history = History(lambda position: None)
        self._control: Control | None = None  # the control endpoints' operations, once started
        self._enrichers = Enrichers(  # its enrich(message) is what every source of messages calls
            timeout=self.config.inbound_timeout,
            max_queries=self.config.max_queries,
            max_predicates=self.config.max_predicates,
        )

    # -- registration -----------------------------------------------------------------------

    def middleware(
        self,
        *,
        version: str,
        create_criteria_from_listener_details: CreateCriteriaFromListenerDetails,
    ) -> Bow:
        """Register how a listener's details become criteria, under a unique version."""
        key = _version("middleware", version)
        _callable("create_criteria_from_listener_details", create_criteria_from_listener_details)
        if key in self._middlewares:
            raise ValueError(f"middleware version {version!r} is already registered")
        self._middlewares[key] = create_criteria_from_listener_details
        self._middleware_names[key] = version
        return self

    def inbound(
        self,
        *,
        path: str,
        create_message_from_request_body: CreateMessageFromRequestBody | None = None,
        middleware_version: str,
        create_message_from_request: CreateMessageFromRequest | None = None,
    ) -> Bow:
        """Register ``POST path`` (aiohttp's syntax: ``/api/message/{topic:.+}`` has a parameter),
        whose JSON bodies (``create_message_from_request_body``) or whole requests
        (``create_message_from_request``, given an :class:`InboundRequest`; exactly one of the
        two) become messages resolved by a middleware version."""
        functions = (create_message_from_request_body, create_message_from_request)
        check_inbound(path, self.config.api_prefix, *functions)
        if path in self._inbounds:
            raise ValueError(f"inbound path {path!r} is already registered")
        self._inbounds[path] = InboundPlugin(
            path,
            create_message_from_request_body,
            _version("middleware_version", middleware_version),
            create_message_from_request=create_message_from_request,
        )
        self._middleware_references.append((f"inbound {path!r}", middleware_version))
        return self

    def outbound(
        self,
        *,
        version: str,
        create_listener_details_from_token: CreateListenerDetailsFromToken,
        middleware_version: str,
        anonymous_criteria: Mapping[str, Any] | None = None,
        create_message_from_publish: CreateMessageFromPublish | None = None,
    ) -> Bow:
        """Register an outbound version (every client protocol) whose tokens become listener
        details; ``anonymous_criteria``: the criteria of a listener without a token (None:
        refused); ``create_message_from_publish``: what a client's publish becomes (None:
        clients cannot publish)."""
        key = _version("outbound", version)
        if key in self._outbounds:
            raise ValueError(f"outbound version {version!r} is already registered")
        _callable("create_listener_details_from_token", create_listener_details_from_token)
        if create_message_from_publish is not None:
            _callable("create_message_from_publish", create_message_from_publish)
        self._outbounds[key] = OutboundPlugin(
            version,
            create_listener_details_from_token,
            _version("middleware_version", middleware_version),
            anonymous_criteria=_anonymous(anonymous_criteria),
            create_message_from_publish=create_message_from_publish,
        )
        self._middleware_references.append((f"outbound {version!r}", middleware_version))
        return self

    def enricher(self, *, filter: str, enrich: Enrich, init: EnrichInit | None = None) -> Bow:
        """Pass every accepted message whose name matches the MQTT topic ``filter`` through
        ``enrich(message) -> message`` before it is positioned, after the enrichers registered
        before; ``init()`` runs once at ``start()`` (see :mod:`bow_gateway.core.enrichers`)."""
        self._enrichers.add(filter, enrich, init)
        return self

    def health_check(self, decorator: HealthCheck) -> Bow:
        """Let ``decorator(request)`` make the ``200`` answer of ``GET /health``."""
        _callable("health_check", decorator)
        self._health_check = decorator
        return self

    # -- control (contract section 9), once started ----------------------------------------

    async def set_criteria(self, changes: Any) -> str:
        """``POST /_bow/criteria`` as a coroutine: ``{"id", "criteria"}`` or a list of them;
        returns the change's position. ``ValueError`` names the field and index."""
        return await self._started_control().set_criteria(changes)

    async def disconnect(self, ids: Any, reason: Any = "", reconnect: Any = "new_token") -> str:
        """``POST /_bow/disconnect``: every socket of ``ids`` gets 4005, then a disconnect."""
        return await self._started_control().disconnect(ids, reason, reconnect)

    async def count(self, audience: Any) -> dict[str, Any]:
        """``POST /_bow/count``: ``{"sockets", "listeners", "complete"}`` for ``audience``."""
        return await self._started_control().count(audience)

    def _started_control(self) -> Control:
        if self._control is None or self._stopping:
            raise RuntimeError("this Bow is not started")
        return self._control

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect the backplane and serve; returns once connections are accepted."""
        if self._runners:
            raise RuntimeError("this Bow is already started")
        self._check_versions()
        await self._enrichers.start()
        release_closed_transports()  # no reference cycle per closed connection (CPython 3.11)
        config = self.config
        backplane = self._own_backplane or backplane_from_config(
            config.redis, namespace=config.namespace, **config.backplane
        )
        await backplane.connect()
        self._backplane = backplane

        async def publish(event: Event) -> str:
            return await backplane.publish(encode_event(event))

        retentions = Retentions(config.history)
        self._publisher = publisher = Publisher(backplane, retentions)

        self._history = history = History(
            backplane.parse_position,
            max_count=config.recovery_max_count,
            max_age=config.recovery_max_age,
            max_bytes=config.recovery_max_bytes,
            max_scan=config.recovery_max_scan,
        )
        self._outbound = outbound = SocketOutbound(
            outbounds=self._outbounds,
            middlewares=self._middlewares,
            indices={version: CriteriaIndex() for version in self._middlewares},
            publish=publish,
            history=history,
            settings=Settings(
                auth_timeout=config.auth_timeout,
                max_buffered_bytes=config.max_buffered_bytes,
                expiry_grace=config.expiry_grace,
                expire_v1_sockets=config.expire_v1_sockets,
                max_sockets_per_id=config.max_sockets_per_id,
                max_buffered_bytes_per_id=config.max_buffered_bytes_per_id,
                max_anonymous=config.max_anonymous,
                max_authenticates_per_minute=config.max_authenticates_per_minute,
                max_filters=config.max_filters,
                max_filters_per_id=config.max_filters_per_id,
                max_filters_per_instance=config.max_filters_per_instance,
                recovery_enabled=config.recovery_enabled,
                max_replay=config.recovery_max_replay,
                position_interval=config.position_interval,
            ),
            claim=backplane.claim,
            release=backplane.release,
            hold=backplane.hold,
            let_go=backplane.let_go,
            max_incoming_bytes=config.max_incoming_bytes,
            body_timeout=config.http_timeout,
            transports=config.transports,
            cors_origins=config.cors_origins,
            metrics=self.metrics,
            topic_history=(
                TopicHistory(
                    backplane.topic_bounds,
                    backplane.topic_read,
                    retentions,
                    max_replays_per_minute=config.recovery_max_replays_per_minute,
                )
                if retentions
                else None
            ),
            client_publish=ClientPublish(
                publisher.published,
                enrich=self._enrichers.enrich_all if self._enrichers else None,
                timeout=config.inbound_timeout,
                max_queries=config.max_queries,
                max_predicates=config.max_predicates,
                max_event_bytes=config.max_event_bytes,
            ),
        )
        consumer = Consumer(
            backplane,
            outbound,
            history,
            self.metrics,
            middleware_versions=self._middlewares,
            count_max_ids=config.count_max_ids,
        )
        backlog = await backplane.backlog(config.recovery_max_count)
        consumer.preload(backlog, complete=len(backlog) < config.recovery_max_count)
        supervise = self._supervisor.start
        self._consumer = supervise(CONSUMER, consumer.run)
        for version, function in self._middlewares.items():
            if isinstance(function, WatchesCriteria):
                job = partial(self._follow, version, function.watch, outbound)
                supervise(f"watcher of middleware {self._middleware_names[version]}", job)
        if config.log_interval:
            interval = config.log_interval
            supervise("listener count", lambda: self._log_listeners(interval))
        supervise("loop lag probe", self._probe_loop_lag)
        supervise("position teller", outbound.delivery.tell_positions)
        supervise("session leases", outbound.sessions.renew)
        if config.gc_freeze:
            supervise("gc freezer", lambda: freeze_after_connects(lambda: outbound.connects))
        raise_young_threshold()
        self._young_raised = True
        try:
            self.port = await self._serve(*self._app(publish, backplane), config.port)
            if config.metrics_port is not None:
                metrics_app = web.Application()
                metrics_app.router.add_get(METRICS_PATH, self.metrics.handle)
                self.metrics_port = await self._serve(metrics_app, {}, config.metrics_port)
        except BaseException:
            await self.stop()
            raise
        logger.info("serving on %s:%d", config.host, self.port)

    def _app(
        self, publish: Callable[[Event], Awaitable[str]], backplane: Backplane
    ) -> tuple[web.Application, dict[bytes, FastRoute]]:
        outbound = self._outbound
        assert outbound is not None
        self._control = Control(self.config, publish, backplane)
        return build_app(
            self.config,
            inbounds=self._inbounds,
            outbound=outbound,
            backplane=backplane,
            publisher=self._publisher,
            control=self._control,
            metrics=self.metrics,
            enrich=self._enrichers.enrich_all if self._enrichers else None,
            health_check=self._health_check,
            serving=lambda: (
                backplane.ready and not self._stopping and not self._supervisor.is_down(CONSUMER)
            ),
        )

    async def _serve(self, app: web.Application, fast: dict[bytes, FastRoute], port: int) -> int:
        """Serve ``app`` on ``port`` (0: any free port), the ``fast`` inbounds' plain requests
        on the fast path (:mod:`bow_gateway.ingress.http_fast_path`); returns the port bound."""
        config = self.config
        runner = app_runner(app, timeout=config.http_timeout)
        await runner.setup()
        self._runners.append(runner)
        if fast:
            assert runner.server is not None
            factory = FastPathServer(
                runner.server,
                fast,
                timeout=config.http_timeout,
                max_body_size=config.max_body_size,
            )
            listening = await asyncio.get_running_loop().create_server(
                factory,
                config.host,
                port,
                ssl=config.ssl_context(),
                backlog=128,  # aiohttp's
                reuse_port=config.reuse_port or None,
            )
            self._fast_paths.append((factory, listening))
            fast_port: int = listening.sockets[0].getsockname()[1]
            return fast_port
        site = web.TCPSite(
            runner,
            config.host,
            port,
            ssl_context=config.ssl_context(),
            reuse_port=config.reuse_port or None,
        )
        await site.start()
        bound: int = runner.addresses[0][1]
        return bound

    async def stop(self) -> None:
        """Stop gracefully within ``drain_timeout``: refuse new messages and connections,
        deliver what was accepted, then close every socket so that its client reconnects
        elsewhere."""
        self._stopping = True
        fast_paths, self._fast_paths = self._fast_paths, []
        for factory, listening in fast_paths:
            listening.close()  # no new connection; busy ones close once they have answered
            factory.close()
        for runner in self._runners:
            for site in list(runner.sites):
                await site.stop()  # no new connection; those open stay until closed below
        try:
            async with asyncio.timeout(self.config.drain_timeout):
                await self._stop_backplane()
        except TimeoutError:
            logger.warning(
                "draining took over %g s: undelivered events dropped", self.config.drain_timeout
            )
            if self._consumer is not None:
                self._consumer.cancel()
                self._consumer = None
        if self._outbound is not None:
            await self._outbound.close_all()
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()
        if self._young_raised:
            restore_young_threshold()
            self._young_raised = False
        for function in {*self._middlewares.values(), *self._inbound_functions()}:
            if isinstance(function, AsyncClosable):
                await function.aclose()
        self._stopping = False

    async def _follow(
        self,
        version: str,
        watch: Callable[[], AsyncIterator[list[ListenerId] | None]],
        outbound: SocketOutbound,
    ) -> None:
        """Re-index listeners whenever a middleware says their criteria changed."""
        name = self._middleware_names[version]
        async for listener_ids in watch():
            try:
                changed = await outbound.refresh(version, listener_ids)
            except Exception:  # the next change must still be followed
                logger.exception("could not refresh the criteria of middleware %s", name)
                continue
            logger.info("middleware %s: criteria of %d listeners changed", name, changed)

    async def _stop_backplane(self) -> None:
        backplane, self._backplane = self._backplane, None
        try:
            if backplane is not None:
                await backplane.disconnect()
        finally:  # also when the drain timeout interrupts it
            helpers = self._supervisor.cancel(keep=(CONSUMER,))
        # gather, not each under suppress(CancelledError): the drain timeout must still get out
        await asyncio.gather(*helpers, return_exceptions=True)
        if self._consumer is not None:
            # The backplane has ended its events: the consumer delivers what it holds, then ends.
            await self._consumer
            self._consumer = None

    def _inbound_functions(self) -> list[object]:
        return [
            *(spec.function for spec in self._inbounds.values()),
            *(spec.create_listener_details_from_token for spec in self._outbounds.values()),
            *(
                spec.create_message_from_publish
                for spec in self._outbounds.values()
                if spec.create_message_from_publish is not None
            ),
            *self._enrichers.functions(),
        ]

    async def _probe_loop_lag(self, interval: float = 0.25, warn_above: float = 1.0) -> None:
        """Measure how late the loop runs a timer; a stall over ``warn_above`` s is logged."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + interval
            await asyncio.sleep(interval)
            lag = max(0.0, loop.time() - due)
            self.metrics.loop_lag_seconds.observe(lag)
            if lag > warn_above:
                logger.warning("the event loop stalled for %.2f s", lag)

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
        for what, middleware_version in self._middleware_references:
            if normalise_version(middleware_version) not in self._middlewares:
                known = ", ".join(sorted(self._middleware_names.values())) or "none"
                raise ValueError(
                    f"{what} names middleware version {middleware_version!r}, "
                    f"which is not registered (registered: {known})"
                )


def _anonymous(criteria: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Anonymous criteria, checked as a middleware's are (without ``__id``: they have none)."""
    if criteria is None:
        return None
    try:
        checked: dict[str, Any] = validate_criteria(criteria, "anonymous")
    except ValueError as error:
        raise ValueError(f"anonymous_criteria: {error}") from None
    del checked[ID_KEY]
    return checked


def _version(field: str, version: Any) -> str:
    if not isinstance(version, str) or not normalise_version(version):
        raise ValueError(f"{field} must be a non-empty string, not {version!r}")
    return normalise_version(version)


def _callable(field: str, function: Any) -> None:
    if not callable(function):
        raise ValueError(f"{field} must be callable, not {type(function).__name__}")
