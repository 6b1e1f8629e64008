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


Item = tuple[str, tuple[int, ...], str | None, float, bytes | MessageEvent | None]
"""One event of the window: its position, the position's key, the message's middleware version
(None: a control event, or a message never replayed), when it was accepted, and the message as
the bytes it crossed the backplane as (or decoded, when no bytes were given).

A plain tuple of strings, numbers and bytes, which the cyclic garbage collector stops tracking
at its first pass: ten thousand decoded messages were some 60,000 objects that every full
collection walked and that the collections before it promoted (under a stream of messages, a
fifth of what they promoted), for a replay that rarely comes."""


@dataclass(slots=True)
class Kept:
    """A message of the window that a recovery looked at: decoded once, its replayed packets
    encoded once per codec for every socket."""

    position: str
    message: MessageEvent
    # the message as replayed, encoded once per codec (by name) for every socket
    packets: dict[str, bytes] | None = None


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
        self._items: deque[Item] = deque()
        self._kept: dict[str, Kept] = {}  # position -> its message, once a recovery decoded it
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
            version: str | None = event.middleware_version
            held: bytes | MessageEvent | None = event if data is None else data
        else:
            version = held = None
        number = self._first + len(self._items)
        self._items.append((position, key, version, at, held))
        self._numbers[position] = number
        self.last = position
        self._messages += version is not None
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
        self._kept.clear()
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
            elif self._items and key < self._items[0][1]:
                return Recovery(False, TOO_OLD, self.last)
            else:  # never given out here, or from the future
                return Recovery(False, UNKNOWN_POSITION, self.last)
        replay: list[Kept] = []
        for position, _, version, _, held in self._after(number):
            if version == middleware_version:
                kept = self._kept.get(position) or self._decoded(position, held)
                if matches(kept.message.message):
                    if len(replay) == max_replay:
                        return Recovery(False, TOO_MANY, self.last)
                    replay.append(kept)
        return Recovery(True, None, self.last, replay)

    def _decoded(self, position: str, held: bytes | MessageEvent | None) -> Kept:
        """The message at ``position``, decoded, kept until it leaves the window."""
        event = decode_event(held) if isinstance(held, bytes) else held
        assert isinstance(event, MessageEvent), "only a message has a version"
        kept = self._kept[position] = Kept(position, event)
        return kept

    def _after(self, number: int) -> Iterator[Item]:
        return itertools.islice(self._items, number + 1 - self._first, None)

    def _forget_old(self) -> None:
        oldest = time.time() - self._max_age
        while self._items and self._items[0][3] < oldest:
            self._forget_one()

    def _forget_one(self) -> None:
        position, key, version, _, _ = self._items.popleft()
        del self._numbers[position]
        if self._kept:
            self._kept.pop(position, None)
        self._messages -= version is not None
        self._first += 1
        self._floor = key
