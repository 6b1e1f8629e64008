"""The backplane interface: how events reach every instance of one gateway, all in one order.

Every backend (:mod:`.memory`, :mod:`.redis`) implements :class:`Backplane`, and refuses what it
cannot take with :class:`BackplaneUnavailable`, which the inbound answers with ``503``. Each event
gets a position (``"{epoch}.{...}"``): opaque to clients, increasing within one epoch, an epoch
being one unbroken history (protocol 2, section 7).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple

from ..core.retention import Retention


class BackplaneUnavailable(Exception):
    """The backplane cannot take an event now; the inbound answers 503 with ``Retry-After``."""

    def __init__(self, reason: str, retry_after: float = 1.0) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Entry:
    """One event read from the backplane, with its position in the history."""

    position: str  # opaque ASCII <= 64 chars, increasing in accept order across instances
    data: bytes


@dataclass(frozen=True, slots=True)
class Gap:
    """The history is broken here: events may be missing before ``position``."""

    position: str  # live delivery continues after it
    reason: str  # "epoch_changed" | "trimmed"


@dataclass(frozen=True, slots=True)
class Stored:
    """One event of a topic's history: its sequence in the topic, its data, when it was kept
    (seconds since the Unix epoch, by the backplane's clock), and its position among all events
    (a reader joining a replay to live delivery knows which of them live delivery brings)."""

    sequence: int
    data: bytes
    time: float
    position: str


class Claim(NamedTuple):
    """An idempotency key claimed with a publish, atomically (contract section 16): a publish
    carrying it appends its events only if no publish took ``key`` within the last ``window``
    seconds, and keeps ``fingerprint``, the position of its last event and ``answer`` under it
    for that long; a publish finding it taken appends nothing and raises
    :class:`AlreadyAccepted`. A named tuple: one is made per keyed request (a third of a frozen
    dataclass's cost)."""

    key: str  # ASCII without spaces, unique per inbound path and Idempotency-Key
    fingerprint: str  # of the request's body (no spaces)
    window: float  # seconds the key stays taken
    answer: str  # what a repeat is answered besides the position (no spaces)


class AlreadyAccepted(Exception):
    """A publish found its :class:`Claim`'s key taken: what the first publish kept."""

    def __init__(self, fingerprint: str, position: str, answer: str) -> None:
        super().__init__(f"already accepted at {position}")
        self.fingerprint = fingerprint
        self.position = position
        self.answer = answer


@dataclass(frozen=True, slots=True)
class Report:
    """One instance's report on a message that asked for a receipt (:meth:`Backplane.report`)."""

    message_id: str
    data: bytes
    until: float  # seconds since the Unix epoch after which it may be forgotten


def with_sequence(data: bytes, sequence: int) -> bytes:
    """An encoded event (a JSON object) carrying its topic sequence as ``"q"``, first."""
    return b'{"q":%d,%s' % (sequence, data[1:])


EPOCH_CHANGED = "epoch_changed"
TRIMMED = "trimmed"


class Backplane(abc.ABC):
    """Carries opaque events from any instance to every instance, in one order."""

    @abc.abstractmethod
    async def connect(self) -> None:
        """Get ready to publish; :meth:`events` yields what is published from now on."""

    @abc.abstractmethod
    async def disconnect(self) -> None:
        """Stop: :meth:`events` ends, :meth:`publish` refuses."""

    @abc.abstractmethod
    async def publish(self, data: bytes) -> str:
        """Hand ``data`` over for delivery and return its position, or raise
        :class:`BackplaneUnavailable`. Once this returns, every instance's :meth:`events` yields it
        (unless a :class:`Gap` says otherwise)."""

    async def publish_many(self, events: list[bytes], claim: Claim | None = None) -> list[str]:
        """Hand ``events`` over in this order, in one trip to the backplane, and return their
        positions (``[]`` for none), or raise :class:`BackplaneUnavailable` (then some of them may
        still be delivered, as a refused :meth:`publish` may). Others publishing meanwhile never
        come between them on this instance. With a ``claim``, atomically: :class:`Claim`.

        This default publishes them one at a time, each after the last was taken, and takes no
        claim: the in-process and Redis backends override it, and so should a backplane of your
        own."""
        if claim is not None:
            raise BackplaneUnavailable(f"{type(self).__name__} takes no idempotency keys")
        return [await self.publish(data) for data in events]

    # -- topic histories (clients.md section 14) -------------------------------------------

    async def publish_retained(
        self, events: list[tuple[bytes, Retention | None]], claim: Claim | None = None
    ) -> list[tuple[str, int | None]]:
        """:meth:`publish_many`, each event with a :class:`Retention` also kept in its topic's
        history under the topic's next sequence (distinct and increasing within the topic, on
        every instance), which its data then carries (:func:`with_sequence`), in the history and
        in :meth:`events` alike, in one atomic step: ``(position, sequence or None)`` each."""
        raise BackplaneUnavailable(f"{type(self).__name__} keeps no topic history")

    async def topic_bounds(self, topic: str) -> tuple[int, int] | None:
        """The first and last sequence ``topic``'s history holds (None: it holds none)."""
        return None

    async def topic_read(self, topic: str, start: int, count: int) -> list[Stored]:
        """At most ``count`` events of ``topic``'s history from sequence ``start`` on, in order
        (those past their ``max_age`` may still be among them: the reader skips them)."""
        return []

    @abc.abstractmethod
    def events(self) -> AsyncIterator[Entry | Gap]:
        """Every event published by any instance from :meth:`connect` on, in one order, and the
        gaps in that history, until :meth:`disconnect`."""

    @abc.abstractmethod
    async def backlog(self, count: int) -> list[Entry]:
        """The newest ``count`` (at most) entries already in the history when :meth:`connect`
        returned, oldest first; called once, right after it, before :meth:`events`."""

    @abc.abstractmethod
    def origin(self) -> str | None:
        """The position before the first entry of the epoch :meth:`connect` found (None while
        Redis has no epoch yet): a client may hold it before any message."""

    @abc.abstractmethod
    def parse_position(self, position: str) -> tuple[str, tuple[int, ...]] | None:
        """``(epoch, sortable key)`` of one of this backend's positions, ``None`` if malformed."""

    @property
    @abc.abstractmethod
    def epoch(self) -> str:
        """The epoch :meth:`events` is in now (ASCII, no ``.``)."""

    @property
    @abc.abstractmethod
    def ready(self) -> bool:
        """Whether :meth:`publish` can take events now (``GET /health`` says 503 when not)."""

    # -- asking every instance (POST /_bow/count) ------------------------------------------

    @abc.abstractmethod
    async def answer(self, request_id: str, data: bytes) -> None:
        """This instance's answer to the request ``request_id`` of :meth:`answers`."""

    @abc.abstractmethod
    async def answers(
        self, request_id: str, publish: Callable[[], Awaitable[str]], timeout: float
    ) -> tuple[list[bytes], bool]:
        """Note the live instances, call ``publish()`` (which publishes the request), then collect
        their answers within ``timeout`` seconds: ``(answers, every live instance answered)``."""

    # -- sockets per id across instances (outbound.max_sockets_per_id) ---------------------

    @abc.abstractmethod
    async def claim(self, key: str, member: str, limit: int) -> bool:
        """Add ``member`` to ``key`` unless ``limit`` live members hold it (0: no limit)."""

    @abc.abstractmethod
    async def release(self, key: str, member: str) -> None:
        """Remove ``member`` from ``key`` (no-op if absent)."""

    # -- receipts across instances (feedback.md section 17) ----------------------------------

    async def report(self, reports: list[Report]) -> None:
        """Keep this instance's latest report on each message (replacing its previous one) until
        the report's ``until``, in one trip; :class:`BackplaneUnavailable` if it cannot."""
        raise BackplaneUnavailable(f"{type(self).__name__} keeps no receipts")

    async def reports(self, message_id: str) -> tuple[dict[str, bytes], set[str]]:
        """Every instance's latest report on ``message_id`` (by instance id), and the instances
        live now."""
        raise BackplaneUnavailable(f"{type(self).__name__} keeps no receipts")

    # -- leases across instances (a Flywheel sessionId held by one identity) ---------------

    @abc.abstractmethod
    async def hold(self, key: str, owner: str, ttl: float) -> bool:
        """Take or renew this instance's hold of the lease ``key`` for ``owner``, for ``ttl``
        seconds: True when the lease was free or is ``owner``'s (held by any instance), False
        when another owner holds it. A lease is held while any instance's hold lasts."""

    @abc.abstractmethod
    async def let_go(self, key: str, owner: str) -> None:
        """End this instance's hold of ``key`` if ``owner`` holds it (no-op otherwise); the
        lease is free once no instance holds it."""
