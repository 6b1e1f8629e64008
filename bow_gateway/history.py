"""The recovery window: the newest events this instance delivered, and what a socket missed.

Fed by the consumer in backplane order (preloaded from the backplane's own retention at start),
so a recovery reads no Redis and ends exactly where live delivery begins. Positions are opaque to
clients; here they are compared through the backplane's ``parse_position``.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

from .changes import Changes
from .message import DISCONNECT, Message, MessageEvent, decode_event

Parse = Callable[[str], "tuple[str, tuple[int, ...]] | None"]

EPOCH_CHANGED: Final = "epoch_changed"
TOO_OLD: Final = "too_old"
TOO_MANY: Final = "too_many"
UNKNOWN_POSITION: Final = "unknown_position"
DISABLED: Final = "disabled"
CONTROL_ITEMS: Final = 4  # items of any kind kept, per message of max_count


@dataclass(slots=True)
class Kept:
    """One event of the window: a message to replay, or a control event's position.

    A message is kept as the bytes it crossed the backplane as, decoded when a recovery first
    looks at it: ten thousand decoded messages are some 60,000 objects that every full garbage
    collection would walk (and the collections before it promote), for a replay that rarely
    comes.
    """

    position: str
    key: tuple[int, ...]
    version: str | None  # the message's middleware version; None: a control event
    at: float  # time.time() when it was accepted
    data: bytes | None = None  # the message's event as it crossed the backplane, until decoded
    decoded: MessageEvent | None = None
    # the message as replayed, encoded once per codec (by name) for every socket
    packets: dict[str, bytes] | None = None

    @property
    def message(self) -> MessageEvent:
        """The message event (decoded from :attr:`data` once, then kept)."""
        if self.decoded is None:
            assert self.data is not None, "a control event is not replayed"
            event = decode_event(self.data)
            assert isinstance(event, MessageEvent)
            self.decoded, self.data = event, None
        return self.decoded


@dataclass(frozen=True, slots=True)
class Recovery:
    """What :meth:`History.recover` found: the messages to replay, or why there are none."""

    recovered: bool
    reason: str | None
    position: str | None  # where replay ends and live delivery begins
    replay: list[Kept] = field(default_factory=list)


class History:
    """The newest ``max_count`` events of the last ``max_age`` seconds, in backplane order."""

    def __init__(
        self,
        parse: Parse,
        *,
        max_count: int = 10_000,
        max_age: float = 120.0,
        max_listeners: int = 100_000,
    ) -> None:
        self._parse = parse
        self._max_count = max_count
        self._max_age = max_age
        self._items: deque[Kept] = deque()
        self._numbers: dict[str, int] = {}  # position -> number of its item (counted from 0)
        self._first = 0  # number of self._items[0]
        self.epoch: str | None = None
        self.last: str | None = None  # the newest position delivered, message or not
        self._floor: tuple[int, ...] | None = None  # key of the last position forgotten
        self.delivered: str | None = None  # the newest position the consumer has delivered
        self._messages = 0  # messages among the items (only they count toward max_count)
        self.changes = Changes(parse, max_listeners=max_listeners)

    def __len__(self) -> int:
        return len(self._items)

    def append(
        self,
        position: str,
        event: object,
        accepted_at: float | None = None,
        data: bytes | None = None,
    ) -> None:
        """One more event, delivered by the consumer; a message is kept to be replayed, as
        ``data`` (the bytes :func:`~.message.decode_event` read it from) when given."""
        parsed = self._parse(position)
        if parsed is None:
            return
        epoch, key = parsed
        if epoch != self.epoch:
            self.restart(position)
        at = accepted_at if accepted_at is not None else time.time()
        if isinstance(event, MessageEvent) and event.message.name != DISCONNECT:
            version = event.middleware_version
            kept = (
                Kept(position, key, version, at, decoded=event)
                if data is None
                else Kept(position, key, version, at, data)
            )
        else:
            kept = Kept(position, key, None, at)
        number = self._first + len(self._items)
        self._items.append(kept)
        self._numbers[position] = number
        self.last = position
        self._messages += kept.version is not None
        # Control events keep their positions (an ack or a __position may name one) without
        # pushing messages out, within a bound of their own.
        while (
            self._messages > self._max_count or len(self._items) > CONTROL_ITEMS * self._max_count
        ):
            self._forget_one()

    def restart(self, position: str) -> None:
        """The history broke (a gap): forget everything; it continues after ``position``."""
        parsed = self._parse(position)
        self._items.clear()
        self._numbers.clear()
        self._first = 0
        self._messages = 0
        self.epoch, self._floor = (None, None) if parsed is None else parsed
        self.last = position

    def is_after(self, position: str, mark: str) -> bool:
        """Whether ``position`` is of ``mark``'s epoch and after it (another epoch: before)."""
        parsed, marked = self._parse(position), self._parse(mark)
        return (
            parsed is not None
            and marked is not None
            and parsed[0] == marked[0]
            and parsed[1] > marked[1]
        )

    def ahead(self, position: str) -> bool:
        """Whether ``position`` is of this epoch and after the newest one read here."""
        parsed = self._parse(position)
        last = None if self.last is None else self._parse(self.last)
        return (
            parsed is not None and last is not None and parsed[0] == last[0] and parsed[1] > last[1]
        )

    def recover(
        self,
        since: str,
        middleware_version: str,
        matches: Callable[[Message], bool],
        max_replay: int = 1_000,
    ) -> Recovery:
        """The messages of ``middleware_version`` after ``since`` that ``matches`` accepts, all
        of them or a reason why not.

        One check (audience, then topic filters) per message in the window at most; nothing is
        replayed in part.
        """
        self._forget_old()
        parsed = self._parse(since) if isinstance(since, str) else None
        if parsed is None:
            return Recovery(False, UNKNOWN_POSITION, self.last)
        epoch, key = parsed
        if epoch != self.epoch:
            return Recovery(False, EPOCH_CHANGED, self.last)
        number = self._numbers.get(since)
        if number is None:
            if self._floor is not None and key == self._floor:
                number = self._first - 1  # the last one forgotten: everything after it is here
            elif self._floor is not None and key < self._floor:
                return Recovery(False, TOO_OLD, self.last)
            elif self._items and key < self._items[0].key:
                return Recovery(False, TOO_OLD, self.last)
            else:  # never given out here, or from the future
                return Recovery(False, UNKNOWN_POSITION, self.last)
        replay: list[Kept] = []
        for item in self._after(number):
            if item.version == middleware_version and matches(item.message.message):
                if len(replay) == max_replay:
                    return Recovery(False, TOO_MANY, self.last)
                replay.append(item)
        return Recovery(True, None, self.last, replay)

    def _after(self, number: int) -> Iterator[Kept]:
        return itertools.islice(self._items, number + 1 - self._first, None)

    def _forget_old(self) -> None:
        oldest = time.time() - self._max_age
        while self._items and self._items[0].at < oldest:
            self._forget_one()

    def _forget_one(self) -> None:
        item = self._items.popleft()
        del self._numbers[item.position]
        self._messages -= item.version is not None
        self._first += 1
        self._floor = item.key
