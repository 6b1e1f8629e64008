"""``Webhooks``: the engine of contract section 19 as the gateway sees it. ``emit`` stores
events (durably with Redis) for the webhooks that take their type; one instance at a time
delivers them (:mod:`.dispatcher`), another taking over within ``lease_ttl`` plus a renewal
when it dies; ``dead`` and ``replay`` serve the control endpoints. Without webhooks it is
inert: ``wants`` is ``False`` and nothing runs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

from ..backplanes import BackplaneUnavailable
from ..core.webhook_settings import Webhook
from ..runtime.metrics import Metrics
from .connectors import Connector
from .dispatcher import Dispatcher
from .events import WebhookEvent, check_event
from .sender import Sender
from .store import WebhookStore, public

logger = logging.getLogger("bow_gateway.webhooks")

MAX_LIMIT: Final = 10_000
"""Dead letters one listing shows, and ids one replay names, at most."""
TASK: Final = "webhook deliveries"

Supervise = Callable[[str, Callable[[], Coroutine[Any, Any, None]]], asyncio.Task[None]]


class Webhooks:
    """The webhooks of one instance. ``supervise(name, job)`` runs the delivering job (the
    gateway's :class:`~bow_gateway.runtime.supervisor.Supervisor`); ``renew_every`` s between
    looks at the lease; ``backoff_base``/``backoff_cap`` shape the retries; at most
    ``max_inflight`` entries are held in memory while delivering. ``connectors`` are destinations
    beside the webhooks (:mod:`.connectors`), their events stored and delivered the same way."""

    def __init__(
        self,
        webhooks: Sequence[Webhook],
        store: WebhookStore,
        metrics: Metrics,
        *,
        connectors: Sequence[Connector] = (),
        renew_every: float = 3.0,
        backoff_base: float = 1.0,
        backoff_cap: float = 300.0,
        max_inflight: int = 10_000,
        tick: float = 1.0,
    ) -> None:
        self.webhooks = tuple(webhooks)
        self.connectors = tuple(connectors)
        self.store = store
        self._metrics = metrics
        targets: list[Webhook | Connector] = [*webhooks, *connectors]
        self._types = frozenset(t for target in targets for t in target.events)
        self._renew_every = renew_every
        self._sender = Sender(webhooks, metrics, backoff_base=backoff_base, backoff_cap=backoff_cap)
        self._max_inflight = max_inflight
        self._tick = tick
        self._task: asyncio.Task[None] | None = None

    def wants(self, event_type: str) -> bool:
        """Whether any webhook takes ``event_type``: emit nothing else."""
        return event_type in self._types

    async def emit(self, events: Sequence[WebhookEvent]) -> None:
        """Store the events some webhook takes, in order; stored (in Redis, with it) once this
        returns. Past the backlog bound they become dead letters instead.
        ``BackplaneUnavailable`` when the store does not take them; ``ValueError`` for an event
        of no known type."""
        for event in events:
            check_event(event)
        wanted = [event for event in events if event.type in self._types]
        if wanted:
            await self.store.append(wanted)

    async def start(self, supervise: Supervise) -> None:
        """Start delivering, under ``supervise``; nothing without webhooks or connectors."""
        if not (self.webhooks or self.connectors) or self._task is not None:
            return
        await self._sender.start()
        for connector in self.connectors:
            await connector.start()
        self._task = supervise(TASK, self._lead)

    async def stop(self) -> None:
        """Stop delivering (a request under way is cut: another instance sends it again), give
        the lease up, close the connections."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await self.store.release()
            await self._sender.close()
        for connector in self.connectors:  # started or not: a store of its own to close
            await connector.close()
        await self.store.close()

    async def dead(self, limit: Any = 100) -> list[dict[str, Any]]:
        """The oldest ``limit`` (1 to 10,000) dead letters, oldest first."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit: an integer from 1 to {MAX_LIMIT}")
        return [public(letter) for letter in await self.store.dead(limit)]

    async def replay(self, ids: Any) -> int:
        """Queue the dead letters of these webhook-ids again (the same ids); how many were."""
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise ValueError("ids: a list of webhook-ids (strings)")
        if len(ids) > MAX_LIMIT:
            raise ValueError(f"ids: at most {MAX_LIMIT}, not {len(ids)}")
        replayed = await self.store.replay(ids) if ids else 0
        logger.info("replayed %d of %d dead letters", replayed, len(ids))
        return replayed

    async def _lead(self) -> None:
        """Deliver while this instance holds the lease; wait for it otherwise."""
        while True:
            if not await self.store.hold():
                await asyncio.sleep(self._renew_every)
                continue
            logger.info("this instance delivers the webhook events")
            dispatcher = Dispatcher(
                self.store,
                self.webhooks,
                self._sender,
                self._metrics,
                connectors=self.connectors,
                max_inflight=self._max_inflight,
                tick=self._tick,
            )
            try:
                await self._deliver(dispatcher)
            except BackplaneUnavailable as error:
                logger.warning("webhook delivery paused: %s", error)
                await asyncio.sleep(self._renew_every)

    async def _deliver(self, dispatcher: Dispatcher) -> None:
        """``dispatcher`` running until the lease is lost (or it fails: raised)."""
        task = asyncio.get_running_loop().create_task(dispatcher.run())
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=self._renew_every)
                if not task.done() and not await self.store.hold():
                    logger.warning("lost the webhooks' lease: another instance delivers")
                    return
            task.result()
        finally:
            task.cancel()
            await asyncio.wait({task}, timeout=self._tick + 2)
            await dispatcher.close()
