"""Delivering while this instance holds the right to: entries taken from the store in order,
each sent to the webhooks that take its type; events with the same key one at a time per webhook,
in order; the others at once (a retry waits on its own, blocking nothing else); every delivery
over written back in batches; overflowed events made dead letters."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ..backplanes import BackplaneUnavailable
from ..core.webhook_settings import Webhook
from ..runtime.metrics import Metrics
from ..runtime.ratelimit import rate_limited
from .connectors import Connector
from .sender import Sender
from .store import Finished, Stored, WebhookStore, dead_letter

logger = rate_limited("bow_gateway.webhooks")

TAKE: Final = 500
"""Entries taken from the store at once, at most."""


@dataclass(frozen=True, slots=True)
class _Job:
    """Entry ``entry``'s delivery to webhook ``index`` (one of ``targets``)."""

    entry: Stored
    index: int
    targets: int
    body: bytes


class Dispatcher:
    """One term of delivering: :meth:`run` until cancelled, then :meth:`close`. At most
    ``max_inflight`` entries are held in memory; ``tick`` s between looks at the overflow and
    the queue's depth. ``connectors`` come after the webhooks, delivering on their own."""

    def __init__(
        self,
        store: WebhookStore,
        webhooks: Sequence[Webhook],
        sender: Sender,
        metrics: Metrics,
        *,
        connectors: Sequence[Connector] = (),
        max_inflight: int = 10_000,
        tick: float = 1.0,
    ) -> None:
        self._store = store
        self._webhooks: list[Webhook | Connector] = [*webhooks, *connectors]
        self._connectors = list(connectors)
        self._connectors_from = len(webhooks)  # the index of the first connector
        self._sender = sender
        self._metrics = metrics
        self._max_inflight = max_inflight
        self._tick = tick
        self._left: dict[str, int] = {}  # entry id: deliveries under way
        self._lanes: dict[tuple[int, str], deque[_Job]] = {}  # (webhook, key): waiting their turn
        self._tasks: set[asyncio.Task[None]] = set()
        self._finished: list[Finished] = []
        self._finished_ready = asyncio.Event()
        self._room = asyncio.Event()

    async def run(self) -> None:
        """Take, deliver, write back, until cancelled (a store fault is waited out)."""
        await self._store.begin()
        loop = asyncio.get_running_loop()
        parts = {loop.create_task(job()) for job in (self._take, self._write_back, self._look)}
        try:
            done, _ = await asyncio.wait(parts, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # a part failed: raised, for the supervisor
        finally:
            every = parts | self._tasks
            for task in every:
                task.cancel()
            # Bounded: a Redis client cut in the middle of a blocking read may take its time.
            await asyncio.wait(every, timeout=self._tick + 1)

    async def close(self, timeout: float = 2.0) -> None:
        """Write back what is over (within ``timeout`` s: else another instance sends it again)."""
        if self._finished:
            with contextlib.suppress(BackplaneUnavailable, TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._store.finish(self._finished)
            self._finished = []

    async def _take(self) -> None:
        while True:
            room = self._max_inflight - len(self._left)
            if room <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            try:
                entries = await self._store.take(min(room, TAKE), self._tick)
            except BackplaneUnavailable as error:
                logger.warning("could not read the webhook events: %s", error)
                await asyncio.sleep(self._tick)
                continue
            for entry in entries:
                self._route(entry)

    def _route(self, entry: Stored) -> None:
        """``entry``'s deliveries, each started now or after those of its key before it."""
        event = entry.event
        targets = [
            index
            for index, webhook in enumerate(self._webhooks)
            if event.type in webhook.events and (not entry.tag or webhook.tag == entry.tag)
        ]
        left = [index for index in targets if self._webhooks[index].tag not in entry.done]
        if not left:  # no webhook takes it (any more), or all had it: gone
            tag = self._webhooks[targets[0]].tag if targets else ""
            self._over(Finished(entry.id, tag, max(1, len(targets))))
            return
        self._left[entry.id] = len(left)
        body = event.body()
        for index in left:
            job = _Job(entry, index, len(targets), body)
            if not event.key:
                self._spawn(job)
                continue
            lane = self._lanes.get((index, event.key))
            if lane is None:
                self._lanes[(index, event.key)] = deque()
                self._spawn(job)
            else:
                lane.append(job)

    def _spawn(self, job: _Job) -> None:
        task = asyncio.get_running_loop().create_task(self._deliver(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, job: _Job) -> None:
        entry, webhook = job.entry, self._webhooks[job.index]
        webhook_id = entry.webhook_id_for(webhook.tag)
        if job.index < self._connectors_from:
            outcome = await self._sender.deliver(job.index, webhook_id, job.body)
        else:
            connector = self._connectors[job.index - self._connectors_from]
            outcome = await connector.deliver(webhook_id, entry.event)
        letter = None
        if not outcome.delivered:
            self._metrics.webhook_dead_letters.labels(self._label(job.index)).inc()
            logger.warning(
                "webhook %d (%s): %s is a dead letter after %d attempts: %s",
                job.index, webhook.shown_url, webhook_id, outcome.attempts, outcome.last_error,
            )  # fmt: skip
            letter = dead_letter(
                webhook_id,
                url=webhook.shown_url,
                tag=webhook.tag,
                event=entry.event,
                attempts=outcome.attempts,
                last_status=outcome.last_status,
                last_error=outcome.last_error,
            )
        self._over(Finished(entry.id, webhook.tag, job.targets, letter))
        self._next_of(job)

    def _label(self, index: int) -> str:
        """The ``webhook`` label of the metrics: a webhook's index, a connector's tag."""
        return str(index) if index < self._connectors_from else self._webhooks[index].tag

    def _next_of(self, job: _Job) -> None:
        """The next delivery of ``job``'s key to its webhook, if one waits."""
        key = job.entry.event.key
        if not key:
            return
        lane = self._lanes.get((job.index, key))
        if lane:
            self._spawn(lane.popleft())
        else:
            self._lanes.pop((job.index, key), None)

    def _over(self, finished: Finished) -> None:
        self._finished.append(finished)
        self._finished_ready.set()
        left = self._left.get(finished.entry, 1) - 1
        if left > 0:
            self._left[finished.entry] = left
        elif self._left.pop(finished.entry, None) is not None:
            self._room.set()

    async def _write_back(self, batch: int = 1_000) -> None:
        while True:
            await self._finished_ready.wait()
            self._finished_ready.clear()
            while self._finished:
                now = self._finished[:batch]
                try:
                    await self._store.finish(now)
                except BackplaneUnavailable as error:
                    logger.warning("could not write webhook deliveries back: %s", error)
                    await asyncio.sleep(self._tick)
                    continue
                del self._finished[: len(now)]

    async def _look(self) -> None:
        """Now and then: overflowed events made dead letters, the queue's depth."""
        while True:
            try:
                await self._bury_overflow()
                self._metrics.webhook_queue_depth.set(await self._store.depth())
            except BackplaneUnavailable as error:
                logger.warning("could not look at the webhook queue: %s", error)
            await asyncio.sleep(self._tick)

    async def _bury_overflow(self) -> None:
        overflowed = await self._store.overflowed(TAKE)
        if not overflowed:
            return
        letters = []
        error = f"the webhook backlog was full ({self._store.max_backlog} events waiting)"
        for entry in overflowed:
            for index, webhook in enumerate(self._webhooks):
                if entry.event.type in webhook.events:
                    self._metrics.webhook_dead_letters.labels(self._label(index)).inc()
                    letters.append(
                        dead_letter(
                            entry.webhook_id_for(webhook.tag),
                            url=webhook.shown_url,
                            tag=webhook.tag,
                            event=entry.event,
                            attempts=0,
                            last_status=None,
                            last_error=error,
                        )
                    )
        self._metrics.webhook_backlog_full.inc(len(overflowed))
        logger.warning("%s: %d events made dead letters at once", error, len(overflowed))
        await self._store.bury([entry.id for entry in overflowed], letters)
