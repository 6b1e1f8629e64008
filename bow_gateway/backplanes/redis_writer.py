"""Writing events to the Redis stream, for :class:`~.redis.RedisBackplane`: events published
while a write is under way go together in the next one, in the order they were published, the
events of one publish never split; a write is one call of the publish script
(:mod:`.redis_scripts`), which also keeps events in their topic's history; one timer fails every
publish awaited past ``publish_timeout``."""

from __future__ import annotations

import asyncio
import secrets
from collections import deque
from typing import Any, TypeAlias

from ..core.retention import Retention
from .base import AlreadyAccepted, Claim
from .redis_ids import as_text
from .redis_scripts import Scripts

Out: TypeAlias = tuple[bytes, Retention | None]
Published: TypeAlias = list[tuple[str, int | None]]
_Group: TypeAlias = tuple[list[Out], asyncio.Future[Published], Claim | None]
"""The events of one publish, in order, their positions (and sequences, for those kept in a
topic's history) once Redis has taken them all, and the idempotency claim they carry (which
covers the group, in the same script call as the groups written with it)."""


class StreamWriter:
    """Sends what is published to the stream ``key`` (see the module's docstring)."""

    def __init__(
        self,
        scripts: Scripts,
        *,
        key: str,
        epoch_key: str,
        sequences_key: str,
        topic_prefix: str,
        claim_prefix: str = "",
        max_len: int = 100_000,
        batch: int = 500,
        batch_bytes: int = 1_048_576,
        publish_timeout: float = 2.0,
    ) -> None:
        self._scripts = scripts
        self._keys = [key, epoch_key, sequences_key]
        self._topic_prefix = topic_prefix
        self._claim_prefix = claim_prefix  # of an idempotency key's key
        self._max_len = max_len
        self._batch = batch
        self._batch_bytes = batch_bytes
        self._publish_timeout = publish_timeout
        self._pending: list[_Group] = []  # published, not yet sent
        self._writer: asyncio.Task[None] | None = None  # sends the pending events, then ends
        # publishes awaited, oldest first, with their deadlines: one timer for all of them
        self._deadlines: deque[tuple[float, asyncio.Future[Published]]] = deque()
        self._watchdog: asyncio.TimerHandle | None = None

    async def write(self, events: list[Out], claim: Claim | None = None) -> Published:
        """Each event's position and sequence (None: not kept) once Redis took them all; the
        write's failure, ``TimeoutError`` past ``publish_timeout``, or :class:`AlreadyAccepted`
        when ``claim``'s key was taken (then nothing was written)."""
        loop = asyncio.get_running_loop()
        written: asyncio.Future[Published] = loop.create_future()
        self._pending.append((events, written, claim))
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write())
        self._watch(loop, written)
        return await written  # failed by the watchdog when late: the writer skips it

    async def drain(self) -> None:
        """Let the writes under way finish, then stop the timer."""
        if self._writer is not None:
            await asyncio.wait({self._writer})
        if self._watchdog is not None:  # every publish awaited was settled by the writer
            self._watchdog.cancel()
            self._watchdog = None
        self._deadlines.clear()

    def _watch(self, loop: asyncio.AbstractEventLoop, written: asyncio.Future[Published]) -> None:
        """Fail ``written`` with ``TimeoutError`` if it is not done within ``publish_timeout``:
        one timer for every publish awaited (an ``asyncio.timeout`` each cost a timer, its
        cancellation and a heap operation per message), armed for the oldest."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][1].done():
            deadlines.popleft()
        deadlines.append((loop.time() + self._publish_timeout, written))
        if self._watchdog is None:
            self._watchdog = loop.call_at(deadlines[0][0], self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._watchdog = None
        deadlines, now = self._deadlines, loop.time()
        while deadlines and (deadlines[0][1].done() or deadlines[0][0] <= now):
            written = deadlines.popleft()[1]
            if not written.done():
                written.set_exception(TimeoutError(f"no answer within {self._publish_timeout}s"))
        if deadlines:
            self._watchdog = loop.call_at(deadlines[0][0], self._expire, loop)

    # -- Redis commands -----------------------------------------------------------------------

    async def _write(self) -> None:
        """Send the pending events, a pipeline at a time, until none is left."""
        batch: list[_Group] = []
        try:
            while self._pending:
                batch = self._next_batch()
                if not batch:  # every publisher of these gave up
                    continue
                events = [data for group, _, _ in batch for data in group]
                try:
                    async with asyncio.timeout(self._publish_timeout):
                        results = await self._xadd(batch)
                except TimeoutError:
                    late = TimeoutError(f"no answer within {self._publish_timeout}s")
                    results = [late] * len(events)
                except Exception as exc:  # noqa: BLE001 - each publisher raises it
                    results = [exc] * len(events)
                start = 0
                for group, written, _ in batch:
                    answers, start = results[start : start + len(group)], start + len(group)
                    if not written.done():
                        _settle(written, answers)
        finally:
            self._writer = None
            for _, written, _ in [*batch, *self._pending]:  # cancelled midway: none will send them
                if not written.done():
                    written.set_exception(OSError("the writer was stopped"))

    def _next_batch(self) -> list[_Group]:
        """The oldest pending groups still awaited, within ``batch`` events and ``batch_bytes``
        (the first group whole, however large: a group is never split); never two claims of one
        key (the second waits for the next write, to find the key taken)."""
        batch: list[_Group] = []
        count = size = taken = 0
        keys: set[str] = set()
        for events, written, claim in self._pending:
            more = sum(len(data) for data, _ in events)
            if batch and (count + len(events) > self._batch or size + more > self._batch_bytes):
                break
            if claim is not None and claim.key in keys:
                break
            taken += 1
            if not written.done():  # else its publisher gave up: not sent
                batch.append((events, written, claim))
                count, size = count + len(events), size + more
                if claim is not None:
                    keys.add(claim.key)
        del self._pending[:taken]
        return batch

    async def _xadd(self, batch: list[_Group]) -> list[Any]:
        """Run the publish script once for every event of ``batch`` (each event a command of its
        own cost the gateway a command to pack and an answer to parse); each event's answer:
        its position and its sequence (None: not kept), or :class:`AlreadyAccepted`."""
        events = [data for group, _, _ in batch for data in group]
        keys = list(self._keys)
        numbers: dict[str, str] = {}  # a history's key: its number among KEYS[4:]
        specs: list[str] = []
        kept: list[str] = []  # each event's history number, "0": not kept
        for _, retention in events:
            if retention is None:
                kept.append("0")
                continue
            key = self._topic_prefix + retention.topic
            number = numbers.get(key)
            if number is None:
                keys.append(key)
                number = numbers[key] = str(len(numbers) + 1)
                max_age_ms = max(1, round(retention.max_age * 1000))
                specs.append(f"{retention.max_count},{max_age_ms}")
            kept.append(number)
        datas = [data for data, _ in events]
        lengths = ",".join([str(len(data)) for data in datas])
        prefix_length = len(self._topic_prefix.encode())
        args = [secrets.token_hex(6), self._max_len, prefix_length, len(specs), *specs]
        args += [",".join(kept), lengths, b"".join(datas)]
        args += self._claims(batch, keys)
        value, *answers = await self._scripts.run("publish", keys, args)
        prefix = bytes(value).partition(b" ")[0].decode() + "."  # the epoch, then the id
        ids, sequences = answers[::2], answers[1::2]
        return [
            _taken(sequence)
            if entry_id == b"="
            else (prefix + as_text(entry_id), int(sequence) or None)
            for entry_id, sequence in zip(ids, sequences, strict=True)
        ]

    def _claims(self, batch: list[_Group], keys: list[str]) -> list[Any]:
        """The script's claim arguments for ``batch`` (their keys appended to ``keys``)."""
        claims: list[str] = []
        numbers: list[str] = []
        for group, _, claim in batch:
            if claim is None:
                numbers += ["0"] * len(group)
                continue
            keys.append(self._claim_prefix + claim.key)
            window_ms = max(1, round(claim.window * 1000))
            claims.append(f"{claim.fingerprint} {window_ms} {claim.answer}")
            numbers += [str(len(claims))] * len(group)
        if not claims:
            return [0]
        return [len(claims), "\n".join(claims), ",".join(numbers)]


def _taken(kept: bytes | str) -> AlreadyAccepted:
    """A claim's key found taken: what it holds, ``"fingerprint position answer"``."""
    fingerprint, position, answer = as_text(kept).split(" ", 2)
    return AlreadyAccepted(fingerprint, position, answer)


def _settle(written: asyncio.Future[Published], answers: list[Any]) -> None:
    """The group's positions (and sequences), or the first failure among them."""
    failure = next((answer for answer in answers if isinstance(answer, Exception)), None)
    if failure is not None:
        written.set_exception(failure)
        return
    written.set_result(answers)
