"""``Bow``: the server that wires inbounds, the backplane, the criteria indices and the outbound."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from functools import partial
from typing import Any, Final

from aiohttp import web

from ..backplanes import Backplane, backplane_from_config
from ..core.criteria import ListenerId
from ..core.history import History
from ..core.message import Event, encode_event
from ..core.plugins import AsyncClosable, WatchesCriteria
from ..core.retention import Retentions
from ..ingress.control import Control
from ..ingress.embedded import EmbeddedPublish
from ..ingress.http_fast_path import FastPathServer, FastRoute
from ..ingress.publisher import Publisher
from ..outbound import SocketOutbound, normalise_version
from ..outbound.consumer import Consumer
from ..runtime.audience_index import AudienceIndex
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
from ..webhooks import (
    Online,
    Webhooks,
    online_from,
    receipt_events_from,
)
from .assembly import history_from, index_from, outbound_from, webhooks_from
from .probes import log_listeners, probe_loop_lag
from .registry import Registry
from .routes import METRICS_PATH, build_app
from .webhooks_api import WebhooksApi

logger = logging.getLogger("bow_gateway")

CONSUMER: Final = "backplane consumer"
"""The supervised task that delivers what the backplane carries: ``/health`` is 503 while it is
down."""


class Bow(WebhooksApi, Registry):
    """One gateway instance: configure it, register versioned plugins, then ``await start()``.

    Every registration returns the same ``Bow`` so calls chain; invalid configuration raises
    ``ValueError`` naming the field, at construction or registration time.
    """

    def __init__(self, config: Mapping[str, Any], *, backplane: Backplane | None = None) -> None:
        """``backplane``: one of your own; by default, the one the ``redis`` setting names."""
        self.config: Config = load_config(config)
        super().__init__(self.config)  # the registrations: middlewares, inbounds, outbounds, ...
        self._own_backplane = backplane
        self.port: int | None = None
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
        self._embedded: EmbeddedPublish | None = None  # Bow.publish, once started
        self._webhooks: Webhooks | None = None  # section 19's engine, once started
        self._online: Online | None = None  # listener.online and .offline, when wanted
        self._index: AudienceIndex | None = None  # section 20's reader, with Redis

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

    async def publish(
        self,
        message: Mapping[str, Any],
        idempotency_key: str | None = None,
        *,
        middleware_version: str | None = None,
        receipt: int | None = None,
        fallback: int | None = None,
    ) -> tuple[str, str]:
        """Publish ``message`` (``{"name", "audience", "payload"}``) as an inbound does: its
        ``(id, position)``. With ``idempotency_key``, a repeat of the same message within
        ``inbound.idempotency_window`` publishes nothing and returns the first's; ``receipt``
        and ``fallback`` (seconds) as ``Bow-Receipt`` and ``Bow-Fallback``. ``ValueError``
        for an invalid message or key; ``BackplaneUnavailable`` to retry (with the same key)."""
        if self._embedded is None or self._stopping:
            raise RuntimeError("this Bow is not started")
        version = None if middleware_version is None else normalise_version(middleware_version)
        return await self._embedded.publish(
            message, idempotency_key, version, receipt=receipt, fallback=fallback
        )

    async def receipt(self, message_id: str) -> dict[str, Any] | None:
        """``GET /_bow/receipts/{id}``: the receipt of a message that asked for one (section
        17), None for an unknown id or one past ``receipts.ttl``."""
        return await self._started_control().receipt(message_id)

    async def presence(
        self, audience: Any, limit: int = 1_000, cursor: str | None = None
    ) -> dict[str, Any]:
        """``POST /_bow/presence``: ``{"listeners", "sockets", "protocols", "next",
        "complete"}``, a page of the listeners matching ``audience`` now, on every instance."""
        return await self._started_control().presence(audience, limit, cursor)

    async def online(self, ids: Any) -> dict[str, Any]:
        """``POST /_bow/online``: ``{"online", "complete"}``, those of ``ids`` connected."""
        return await self._started_control().online(ids)

    async def reach(self, audience: Any) -> dict[str, Any] | None:
        """``POST /_bow/reach`` (section 20): ``{"listeners", "online", "generation",
        "complete"}`` over the criteria job's audience index; None without one."""
        return await self._started_control().reach(audience)

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
        self._webhooks = webhooks = webhooks_from(config, self.metrics)
        self._index = index_from(config)

        async def publish(event: Event) -> str:
            return await backplane.publish(encode_event(event))

        retentions = Retentions(config.history)
        self._publisher = publisher = Publisher(backplane, retentions)
        self._history = history = history_from(config, backplane)
        self._outbound = outbound = outbound_from(
            config,
            outbounds=self._outbounds,
            middlewares=self._middlewares,
            backplane=backplane,
            publish=publish,
            publisher=publisher,
            retentions=retentions,
            history=history,
            enrichers=self._enrichers,
            metrics=self.metrics,
        )
        await self._start_consumer(backplane, outbound, history)
        self._supervise_helpers(outbound)
        await webhooks.start(self._supervisor.start)
        self._feed_webhooks(webhooks, backplane, outbound)
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

    async def _start_consumer(
        self, backplane: Backplane, outbound: SocketOutbound, history: History
    ) -> None:
        """The backplane's backlog into the history, then the consumer, supervised."""
        config = self.config
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
        self._consumer = self._supervisor.start(CONSUMER, consumer.run)

    def _supervise_helpers(self, outbound: SocketOutbound) -> None:
        """The background tasks beside the consumer: the middlewares' watchers, the probes,
        the position teller, the session leases, the gc freezer."""
        config = self.config
        supervise = self._supervisor.start
        for version, function in self._middlewares.items():
            if isinstance(function, WatchesCriteria):
                job = partial(self._follow, version, function.watch, outbound)
                supervise(f"watcher of middleware {self._middleware_names[version]}", job)
        if config.log_interval:
            interval = config.log_interval
            supervise("listener count", lambda: log_listeners(outbound, interval))
        supervise("loop lag probe", lambda: probe_loop_lag(self.metrics))
        supervise("position teller", outbound.delivery.tell_positions)
        supervise("session leases", outbound.sessions.renew)
        supervise("receipts", outbound.receipts.run)
        if config.gc_freeze:
            supervise("gc freezer", lambda: freeze_after_connects(lambda: outbound.connects))

    def _feed_webhooks(
        self, webhooks: Webhooks, backplane: Backplane, outbound: SocketOutbound
    ) -> None:
        """The outbound's news for the webhooks that want it: sockets taking an id and going
        (``listener.online``/``offline``), receipts ending (``message.receipt``/``undelivered``)."""
        self._online = online = online_from(self.config, webhooks, backplane)
        if online is not None:
            outbound.admission.arrivals = online
            self._supervisor.start("online and offline", online.run)
        index = self._index
        outbound.receipts.on_final = receipt_events_from(self.config, webhooks, backplane, index)
        if index is not None:  # reports carry the audience; fallbacks keep every id reached
            outbound.receipts.whole_base = self.config.fallback_max_listeners

    def _app(
        self, publish: Callable[[Event], Awaitable[str]], backplane: Backplane
    ) -> tuple[web.Application, dict[bytes, FastRoute]]:
        outbound = self._outbound
        assert outbound is not None
        self._control = Control(self.config, publish, backplane, self._index)
        config = self.config
        self._embedded = EmbeddedPublish(
            self._publisher.positions,
            list(self._middlewares),
            enrich=self._enrichers.enrich_all if self._enrichers else None,
            max_queries=config.max_queries,
            max_predicates=config.max_predicates,
            max_event_bytes=config.max_event_bytes,
            idempotency_window=config.idempotency_window,
        )
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
            webhooks=self._webhooks,
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
            self._outbound.receipts.close()
        if self._online is not None:  # the sockets just closed: their ids start leaving
            await self._online.flush(timeout=self.config.drain_timeout)
            self._online = None
        if self._webhooks is not None:
            await self._webhooks.stop()
        if self._index is not None:
            await self._index.client.aclose()
            self._index = None
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()
        if self._young_raised:
            restore_young_threshold()
            self._young_raised = False
        for function in set(self._plugin_functions()):
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
