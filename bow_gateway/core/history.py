"""The recovery window: the newest events this instance delivered, and what a socket missed.

Fed by the consumer in backplane order (preloaded from the backplane's own retention at start),
so a recovery reads no Redis and ends exactly where live delivery begins. Positions are opaque to
clients; here they are compared through the backplane's ``parse_position``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

from .changes import Changes
from .message import Message, MessageEvent, decode_event
from .names import DISCONNECT

Parse = Callable[[str], "tuple[str, tuple[int, ...]] | None"]

EPOCH_CHANGED: Final = "epoch_changed"
TOO_OLD: Final = "too_old"
TOO_MANY: Final = "too_many"
UNKNOWN_POSITION: Final = "unknown_position"
DISABLED: Final = "disabled"
CONTROL_ITEMS: Final = 4  # items of any kind kept, per message of max_count
DECODED_SIZE: Final = 1_024  # bytes counted for a message kept decoded (given without its bytes)
ENTRY_SIZE: Final = 400  # bytes counted for an entry besides its message's bytes (measured: the
# tuple, its position, key and time, the number of the position: some 380)
SLICE_ENTRIES: Final = 256  # entries a slice of a recovery or a replay looks at, at most
SLICE_SECONDS: Final = 0.001  # and its work, at most (a slice ends at the first entry past it)
RECOVERY_SLICE_ENTRIES: Final = 65_536  # a recovery's slices, bounded by time: no entry is encoded
CLOCK_EVERY: Final = 16  # entries between two readings of the clock (a decoding may take 1 ms)
DROP_SECONDS: Final = 0.002  # decoded messages let go at a time, at most (see History._drop_kept)
RECOVERY_CHUNK: Final = 128  # a recovery's entries between two, and after each decoding


class Lane:
    """Long work (recoveries, topic replays) done in slices that take turns: a slice ends after
    :data:`SLICE_ENTRIES` entries or :data:`SLICE_SECONDS` of work, then the event loop runs
    (live delivery, I/O) and the other slices waiting, in turn, before the next one. However many
    recoveries run at once, the event loop waits for about one slice at a time."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    def slices(self, entries: int = SLICE_ENTRIES) -> Slices:
        """Slices of at most ``entries`` entries (and :data:`SLICE_SECONDS`) each."""
        return Slices(self._lock, entries)


class Slices:
    """One piece of work's slices on a :class:`Lane`: :meth:`begin` before its first slice,
    :meth:`due` after each entry, :meth:`pause` between two slices, :meth:`end` when it stops
    (or before it awaits anything else)."""

    __slots__ = ("_entries", "_held", "_left", "_lock", "_until", "pauses")

    def __init__(self, lock: asyncio.Lock, entries: int = SLICE_ENTRIES) -> None:
        self._lock = lock
        self._entries = entries
        self._held = False
        self._left = entries
        self._until = 0.0
        self.pauses = 0

    async def begin(self) -> None:
        """Wait for this work's turn (at once when no other slice waits), and start a slice."""
        if not self._held:
            await self._lock.acquire()
            self._held = True
        self._left = self._entries
        self._until = time.perf_counter() + SLICE_SECONDS

    def due(self) -> bool:
        """One more entry done: whether this slice is over (the clock read every
        :data:`CLOCK_EVERY` entries)."""
        left = self._left = self._left - 1
        return left <= 0 or (not left % CLOCK_EVERY and time.perf_counter() >= self._until)

    def expired(self) -> bool:
        """Whether this slice's time is over."""
        return time.perf_counter() >= self._until

    def done(self, entries: int) -> bool:
        """``entries`` more done at once: whether this slice is over."""
        self._left -= entries
        return self._left <= 0 or time.perf_counter() >= self._until

    async def pause(self) -> None:
        """Let the event loop, then the other slices waiting, run; then start the next slice."""
        self.end()
        self.pauses += 1
        await asyncio.sleep(0)
        await self.begin()

    def end(self) -> None:
        if self._held:
            self._held = False
            # Released at the event loop's next step, not now: work that wakes in this step
            # (many replays' timers at once) waits its turn instead of taking the lane right
            # after this slice, so that a step runs one slice at most, however many share it.
            asyncio.get_running_loop().call_soon(self._lock.release)


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
    size: int = DECODED_SIZE  # bytes counted for it in the window (History._decoded)


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
        max_bytes: int = 33_554_432,
        max_scan: int = 10_000,
    ) -> None:
        self._parse = parse
        self._max_count = max_count
        self.max_bytes = max_bytes
        self._max_scan = max_scan
        self._bytes = 0  # what the items hold: ENTRY_SIZE each, and their messages' bytes
        self._kept_bytes = 0  # what the recoveries' decoded messages hold (see _decoded)
        self._recovering = 0  # recoveries under way (they share the decoded messages)
        self._generation = 0  # counts restarts: a recovery under way sees the history broke
        self.lane = Lane()
        self._max_age = max_age
        self._items: deque[Item] = deque()
        # position -> its message, once a recovery decoded it (oldest first)
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._numbers: dict[str, int] = {}  # position -> number of its item (counted from 0)
        self._first = 0  # number of self._items[0]
        self.epoch: str | None = None
        self.last: str | None = None  # the newest position delivered, message or not
        self._floor: tuple[int, ...] | None = None  # key of the last position forgotten
        self._floor_position: str | None = None  # and that position, exactly as given out
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
            self._bytes += DECODED_SIZE if data is None else len(data)
        else:
            version = held = None
        self._bytes += ENTRY_SIZE
        number = self._first + len(self._items)
        self._items.append((position, key, version, at, held))
        self._numbers[position] = number
        self.last = position
        self._messages += version is not None
        # Control events keep their positions (an ack or a __position may name one) without
        # pushing messages out, within a bound of their own.
        while (
            self._messages > self._max_count
            or self._bytes > self.max_bytes
            or len(self._items) > CONTROL_ITEMS * self._max_count
        ):
            self._forget_one()
        if self._kept_bytes and self._bytes + self._kept_bytes > self.max_bytes:
            self._drop_kept()

    def restart(self, position: str) -> None:
        """The history broke (a gap): forget everything; it continues after ``position``."""
        parsed = self._parse(position)
        self._items.clear()
        self._kept.clear()
        self._numbers.clear()
        self._first = 0
        self._messages = 0
        self._bytes = self._kept_bytes = 0
        self._generation += 1
        self.epoch, self._floor = (None, None) if parsed is None else parsed
        self._floor_position = None if parsed is None else position
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

    async def recover(
        self,
        since: str,
        middleware_version: str,
        matches: Callable[[Message], bool],
        max_replay: int = 1_000,
    ) -> Recovery:
        """The messages of ``middleware_version`` after ``since`` that ``matches`` accepts, all
        of them or a reason why not; the replay ends at the newest position of now, which the
        result gives (what comes after it is live).

        One check (audience, then topic filters) per message in the window at most, and at most
        ``max_scan`` entries looked at (more: ``too_many`` at once, with no work), in slices that
        take turns with the event loop (:class:`Lane`); nothing is replayed in part. ``since``
        must be a position given out exactly (one forged from another is unknown).
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
            if since == self._floor_position:
                number = self._first - 1  # the last one forgotten: everything after it is here
            elif self._floor is not None and key < self._floor:
                return Recovery(False, TOO_OLD, self.last)
            elif self._items and key < self._items[0][1]:
                return Recovery(False, TOO_OLD, self.last)
            else:  # never given out here, forged, or from the future
                return Recovery(False, UNKNOWN_POSITION, self.last)
        last, end = self.last, self._first + len(self._items) - 1  # the replay ends there
        if end - number > self._max_scan:
            return Recovery(False, TOO_MANY, last)
        generation = self._generation
        slices = self.lane.slices(RECOVERY_SLICE_ENTRIES)
        replay: list[Kept] = []
        self._recovering += 1
        number += 1  # the next entry to look at
        try:
            await slices.begin()
            while number <= end:
                if self._generation != generation:  # a gap: live delivery says so
                    return Recovery(False, EPOCH_CHANGED, self.last)
                if number < self._first:  # what was left to look at left the window
                    return Recovery(False, TOO_OLD, self.last)
                # From here (the window may have changed during a pause), a few entries at a time
                # in a tight loop, the slice's bounds checked between them
                entries = itertools.islice(self._items, number - self._first, end + 1 - self._first)
                while number <= end:
                    count = min(RECOVERY_CHUNK, end + 1 - number)
                    expired = False  # the clock is read after each decoding: it may take 1 ms
                    for position, _, version, _, held in itertools.islice(entries, count):
                        if version == middleware_version:
                            kept = self._kept.get(position)
                            if kept is None:
                                kept = self._decoded(position, held)
                                expired = slices.expired()
                            if matches(kept.message.message):
                                if len(replay) == max_replay:
                                    return Recovery(False, TOO_MANY, last)
                                replay.append(kept)
                            if expired:
                                break
                    number = self._numbers[position] + 1 if expired else number + count
                    if number <= end and (expired or slices.done(count)):
                        await slices.pause()
                        break
        finally:
            slices.end()
            self._recovering -= 1
            if self._kept_bytes and self._bytes + self._kept_bytes > self.max_bytes:
                self._drop_kept()
        return Recovery(True, None, last, replay)

    def _decoded(self, position: str, held: bytes | MessageEvent | None) -> Kept:
        """The message at ``position``, decoded, kept until it leaves the window or until the
        window holds more than ``max_bytes`` with it when no recovery is under way.

        The recoveries under way share it (and the packets each codec replays it as): however
        many sockets recover at once, a message is decoded once. It counts its bytes twice (its
        decoded form, its packet) and :data:`DECODED_SIZE`; the oldest decoded go first when the
        window's entries and they hold more than ``max_bytes`` (what a recovery then looks at
        again is decoded again): at rest, the window holds ``max_bytes`` at most, once the
        events after a recovery let them go (a few milliseconds at a time)."""
        if isinstance(held, bytes):
            event: object = decode_event(held)
            size = 2 * len(held) + DECODED_SIZE
        else:
            event, size = held, DECODED_SIZE
        assert isinstance(event, MessageEvent), "only a message has a version"
        kept = self._kept[position] = Kept(position, event, None, size)
        self._kept_bytes += size
        return kept

    def _drop_kept(self) -> None:
        """Let the oldest decoded messages go until the window holds ``max_bytes`` at most (none
        while a recovery is under way: it may look at them again), for :data:`DROP_SECONDS` at a
        time: freeing what a long recovery decoded at once stalled the loop 200 ms (1,600
        messages of 2,000 objects each); the rest goes at the next events."""
        if self._recovering:
            return
        kept = self._kept
        until = time.perf_counter() + DROP_SECONDS
        while kept and self._bytes + self._kept_bytes > self.max_bytes:
            self._kept_bytes -= kept.popitem(last=False)[1].size
            if time.perf_counter() >= until:
                return

    def _after(self, number: int) -> Iterator[Item]:
        return itertools.islice(self._items, number + 1 - self._first, None)

    def _forget_old(self) -> None:
        oldest = time.time() - self._max_age
        while self._items and self._items[0][3] < oldest:
            self._forget_one()

    def _forget_one(self) -> None:
        position, key, version, _, held = self._items.popleft()
        del self._numbers[position]
        if self._kept and (kept := self._kept.pop(position, None)) is not None:
            self._kept_bytes -= kept.size
        self._bytes -= ENTRY_SIZE
        if version is not None:
            self._messages -= 1
            self._bytes -= len(held) if isinstance(held, bytes) else DECODED_SIZE
        self._first += 1
        self._floor = key
        self._floor_position = position
