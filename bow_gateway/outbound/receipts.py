"""Receipts (contract section 17), this instance's side: what it did with each message that asked
for one, reported to the backplane while the receipt is open and once more, final, at its end.

Delivery asks for a :class:`Tracked` per such message; protocol-2 Socket.IO sockets get the
message under one acknowledgement id (the same for all: the packet is still encoded once), and
their acknowledgements come back here. Messages without ``Bow-Receipt`` never come here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

from ..backplanes import BackplaneUnavailable, Report
from ..core.criteria import ListenerId
from ..core.message import MessageEvent, dumps, id_text
from ..core.receipts import named_ids
from ..runtime.ratelimit import rate_limited
from .connection import Connection

logger = logging.getLogger("bow_gateway.receipts")
warnings = rate_limited("bow_gateway.receipts")

REPORT_AFTER: Final = 1.5
"""Seconds after a receipt's end that the instances that read its message look at it whole."""
GIVE_UP_AFTER: Final = 5.0
"""Seconds after its end that an incomplete receipt (an instance late) is taken as it is."""

IdKey = str | tuple[str, str]
"""A listener id as the sets of a receipt tell ids apart: a string id itself, any other its JSON
text (in a tuple), so that two ids are one exactly when their JSON texts are (as ``named_ids``)."""


def id_key(listener_id: ListenerId) -> IdKey:
    """``listener_id``'s :data:`IdKey`: no JSON encoding for a string (the usual id)."""
    return listener_id if isinstance(listener_id, str) else ("", id_text(listener_id))


ReportTo = Callable[[list[Report]], Awaitable[None]]
"""Where reports go (the backplane's ``report``)."""
Final_ = Callable[[str, MessageEvent], Awaitable[None]]
"""What happens to a receipt once every instance reported it final (the app's webhooks)."""


class Tracked:
    """One message that asked for a receipt, as this instance delivered it."""

    __slots__ = (
        "accepted_at",
        "ack_id",
        "acked",
        "acked_ids",
        "audience",
        "delivered",
        "delivered_ids",
        "dirty",
        "ends",
        "event",
        "matched",
        "named",
        "position",
        "reached",
        "reached_bound",
    )

    def __init__(
        self, event: MessageEvent, position: str, ack_id: int, max_ids: int, whole_base: int = 0
    ) -> None:
        self.event = event
        self.position = position
        self.ack_id = ack_id
        self.accepted_at = event.accepted_at or time.time()
        self.ends = self.accepted_at + event.receipt
        self.matched = 0
        self.delivered: set[str] = set()  # sids: only they may acknowledge
        self.acked: set[str] = set()
        self.delivered_ids: dict[IdKey, ListenerId] | None = {}
        self.acked_ids: dict[IdKey, ListenerId] | None = {}
        named = named_ids(event.message.audience)
        self.named = None if len(named) > max_ids else {id_key(i): i for i in named}
        # ids acknowledged, or delivered (no ack): the named ones, or (a fallback with the
        # audience index) any, up to ``reached_bound``
        self.reached: dict[IdKey, ListenerId] = {}
        self.reached_bound = whole_base if event.fallback else 0
        self.audience = event.message.audience if whole_base else None
        self.dirty = True

    def reach(self, key: IdKey, listener_id: ListenerId) -> None:
        """``listener_id`` was reached (acknowledged, or delivered where none acknowledges)."""
        if (self.named is not None and key in self.named) or (
            len(self.reached) < self.reached_bound
        ):
            self.reached[key] = listener_id

    def report(self, final: bool, ttl: float) -> Report:
        document = {
            "p": self.position,
            "s": self.event.receipt,
            "a": self.accepted_at,
            "m": self.matched,
            "d": len(self.delivered),
            "k": len(self.acked),
            "di": _ids(self.delivered_ids),
            "ki": _ids(self.acked_ids),
            "oi": list(self.reached.values()),
            "n": _ids(self.named),
            "f": final,
        }
        if self.audience is not None:  # for the receipt's missed over the audience index
            document["au"] = self.audience
        return Report(self.event.id, dumps(document), self.ends + ttl)


async def _unreported(reports: list[Report]) -> None:
    raise BackplaneUnavailable("no backplane to report receipts to")


def _ids(ids: dict[IdKey, ListenerId] | None) -> list[ListenerId] | None:
    return None if ids is None else list(ids.values())


class Receipts:
    """The receipts this instance tracks: at most ``max_open`` at once (a message past that is
    delivered without one, and a warning says so), each id list cut off at ``max_ids`` (then
    ``null``; counts stay exact), reports kept ``ttl`` seconds after the end, flushed every
    ``flush_every`` seconds. ``whole_base`` (with the audience index, section 20): reports
    carry the audience, and a fallback's reached ids are kept up to that many."""

    def __init__(
        self,
        report: ReportTo | None = None,
        *,
        max_ids: int = 10_000,
        ttl: float = 3_600.0,
        max_open: int = 100_000,
        flush_every: float = 0.25,
        on_final: Final_ | None = None,
        whole_base: int = 0,
    ) -> None:
        self._report = report or _unreported
        self._max_ids = max_ids
        self._ttl = ttl
        self._max_open = max_open
        self._flush_every = flush_every
        self.whole_base = whole_base  # set by the app once it knows of an audience index
        self.on_final = on_final  # set by the app once its webhooks exist
        self._open: dict[int, Tracked] = {}  # by acknowledgement id
        self._ack_ids = itertools.count(1)
        self._finishing: set[asyncio.Task[None]] = set()

    def track(self, event: MessageEvent, position: str, matched: int) -> Tracked | None:
        """A message asking for a receipt, about to be delivered to ``matched`` sockets; None
        past ``max_open`` (delivered without a receipt) or already over."""
        if len(self._open) >= self._max_open:
            warnings.warning(
                "%d receipts open on this instance (the most): message %s has none here",
                self._max_open,
                event.id,
            )
            return None
        tracked = Tracked(event, position, next(self._ack_ids), self._max_ids, self.whole_base)
        if tracked.ends <= time.time():
            return None  # read after its end (a lagging instance): nothing to report
        tracked.matched = matched
        self._open[tracked.ack_id] = tracked
        return tracked

    def delivered(self, tracked: Tracked, connection: Connection, acknowledges: bool) -> None:
        """Its frame was handed to ``connection``'s transport; ``acknowledges``: it may ack."""
        tracked.delivered.add(connection.sid)
        tracked.dirty = True
        listener_id = connection.listener_id
        if listener_id is None or isinstance(listener_id, tuple):
            return
        key = id_key(listener_id)
        ids = tracked.delivered_ids
        if ids is not None:
            ids[key] = listener_id
            if len(ids) > self._max_ids:
                tracked.delivered_ids = None
        if not acknowledges:
            tracked.reach(key, listener_id)

    def acknowledged(self, connection: Connection, ack_id: int) -> bool:
        """``connection`` acknowledged the event it got under ``ack_id``: counted once, if it
        was delivered it and the receipt is open; whether it was (anything else is ignored)."""
        tracked = self._open.get(ack_id)
        sid = connection.sid
        if tracked is None or sid not in tracked.delivered or sid in tracked.acked:
            return False
        if time.time() >= tracked.ends:
            return False
        tracked.acked.add(sid)
        tracked.dirty = True
        listener_id = connection.listener_id
        if listener_id is None or isinstance(listener_id, tuple):
            return True
        key = id_key(listener_id)
        ids = tracked.acked_ids
        if ids is not None:
            ids[key] = listener_id
            if len(ids) > self._max_ids:
                tracked.acked_ids = None
        tracked.reach(key, listener_id)
        return True

    async def run(self) -> None:
        """Forever: report what changed, and the receipts that ended (final)."""
        while True:
            await asyncio.sleep(self._flush_every)
            await self.flush()

    async def flush(self) -> None:
        """One report of every receipt that changed or ended since the last."""
        now = time.time()
        ended = [t for t in self._open.values() if t.ends <= now]
        changed = [t for t in self._open.values() if t.dirty and t.ends > now]
        if not ended and not changed:
            return
        reports = [t.report(False, self._ttl) for t in changed]
        reports += [t.report(True, self._ttl) for t in ended]
        try:
            await self._report(reports)
        except BackplaneUnavailable as error:
            warnings.warning("could not report %d receipts (retried): %s", len(reports), error)
            return
        for tracked in changed:
            tracked.dirty = False
        for tracked in ended:
            del self._open[tracked.ack_id]
            if self.on_final is not None:
                self._finish_later(tracked.event)

    def _finish_later(self, event: MessageEvent) -> None:
        task = asyncio.create_task(self._finish(event), name=f"receipt of {event.id}")
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _finish(self, event: MessageEvent) -> None:
        assert self.on_final is not None
        ends = (event.accepted_at or time.time()) + event.receipt
        await asyncio.sleep(max(0.0, ends + REPORT_AFTER - time.time()))
        try:
            await self.on_final(event.id, event)
        except Exception:
            logger.exception("could not finish the receipt of message %s", event.id)

    def close(self) -> None:
        """Stop looking at receipts that ended (a stopping instance: the others still do)."""
        for task in self._finishing:
            task.cancel()

    @property
    def open(self) -> int:
        """How many receipts this instance tracks now."""
        return len(self._open)
