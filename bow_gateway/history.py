"""The recovery window: the newest events this instance delivered, and what a socket missed.

Fed by the consumer in backplane order (preloaded from the backplane's own retention at start),
so a recovery reads no Redis and ends exactly where live delivery begins. Positions are opaque to
clients; here they are compared through the backplane's ``parse_position``.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Final

from .message import DISCONNECT, Message, MessageEvent

Parse = Callable[[str], "tuple[str, tuple[int, ...]] | None"]

EPOCH_CHANGED: Final = "epoch_changed"
TOO_OLD: Final = "too_old"
TOO_MANY: Final = "too_many"
UNKNOWN_POSITION: Final = "unknown_position"
DISABLED: Final = "disabled"


@dataclass(slots=True)
class _Item:
    position: str
    key: tuple[int, ...]
    message: MessageEvent | None  # None: a control event, or a message never replayed
    at: float  # time.time() when it was accepted


@dataclass(frozen=True, slots=True)
class Recovery:
    """What :meth:`History.recover` found: the messages to replay, or why there are none."""

    recovered: bool
    reason: str | None
    position: str | None  # where replay ends and live delivery begins
    replay: list[tuple[str, MessageEvent]] = field(default_factory=list)


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
        self._items: deque[_Item] = deque()
        self._numbers: dict[str, int] = {}  # position -> number of its item (counted from 0)
        self._first = 0  # number of self._items[0]
        self.epoch: str | None = None
        self.last: str | None = None  # the newest position delivered, message or not
        self._floor: tuple[int, ...] | None = None  # key of the last position forgotten
        # (middleware version, listener id) -> its latest criteria changes: (position key, entries)
        self._criteria: OrderedDict[tuple[str, Hashable], list[tuple[tuple[int, ...], Hashable]]]
        self._criteria = OrderedDict()
        self._max_listeners = max_listeners

    def __len__(self) -> int:
        return len(self._items)

    def append(self, position: str, event: object, accepted_at: float | None = None) -> None:
        """One more event, delivered by the consumer; a message is kept to be replayed."""
        parsed = self._parse(position)
        if parsed is None:
            return
        epoch, key = parsed
        if epoch != self.epoch:
            self.restart(position)
        message = event if isinstance(event, MessageEvent) else None
        if message is not None and message.message.name == DISCONNECT:
            message = None
        at = accepted_at if accepted_at is not None else time.time()
        number = self._first + len(self._items)
        self._items.append(_Item(position, key, message, at))
        self._numbers[position] = number
        self.last = position
        if len(self._items) > self._max_count:
            self._forget_one()

    def note_criteria(
        self, position: str, version: str, listener_id: Hashable, entries: Hashable
    ) -> None:
        """A listener's criteria changed at ``position`` (kept for ``criteria_changed``; the
        last few changes of the ``max_listeners`` listeners changed most recently)."""
        parsed = self._parse(position)
        if parsed is None:
            return
        key = (version, listener_id)
        changes = self._criteria.pop(key, [])
        changes.append((parsed[1], entries))
        self._criteria[key] = changes[-4:]
        if len(self._criteria) > self._max_listeners:
            self._criteria.popitem(last=False)

    def criteria_at(self, since: str, version: str, listener_id: Hashable) -> Hashable | None:
        """The criteria (entries) this listener had at ``since``, as far as known, else None."""
        parsed = self._parse(since) if isinstance(since, str) else None
        changes = self._criteria.get((version, listener_id))
        if parsed is None or not changes:
            return None
        before = [entries for key, entries in changes if key <= parsed[1]]
        return before[-1] if before else changes[0][1]

    def restart(self, position: str) -> None:
        """The history broke (a gap): forget everything; it continues after ``position``."""
        parsed = self._parse(position)
        self._items.clear()
        self._numbers.clear()
        self._first = 0
        self.epoch, self._floor = (None, None) if parsed is None else parsed
        self.last = position

    def recover(
        self, since: str, matches: Callable[[Message], bool], max_replay: int = 1_000
    ) -> Recovery:
        """The messages after ``since`` that ``matches`` accepts, all of them or a reason why not.

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
        replay: list[tuple[str, MessageEvent]] = []
        for item in self._after(number):
            message = item.message
            if message is not None and matches(message.message):
                if len(replay) == max_replay:
                    return Recovery(False, TOO_MANY, self.last)
                replay.append((item.position, message))
        return Recovery(True, None, self.last, replay)

    def _after(self, number: int) -> Iterator[_Item]:
        return itertools.islice(self._items, number + 1 - self._first, None)

    def _forget_old(self) -> None:
        oldest = time.time() - self._max_age
        while self._items and self._items[0].at < oldest:
            self._forget_one()

    def _forget_one(self) -> None:
        item = self._items.popleft()
        del self._numbers[item.position]
        self._first += 1
        self._floor = item.key
