"""Where webhook events wait: the interface both stores keep (:mod:`.store_memory` in this
process, :mod:`.store_redis` in Redis), and what crosses it: the entries taken, the deliveries
finished, the dead letters.

An entry is one event for every webhook that takes its type (or, replayed, for one of them). The
``webhook-id`` of its request to a webhook is ``msg_{entry id}_{webhook tag}``, or the first one's
for a replay: the same across retries, takeovers and replays, unique per event and webhook.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import orjson

from ..core.message import dumps
from .events import WebhookEvent

PUBLIC_FIELDS: Final = (
    "id",
    "url",
    "type",
    "attempts",
    "last_status",
    "last_error",
    "created_at",
)
"""What ``GET /_bow/webhooks/dead`` shows of a dead letter (the rest is kept for a replay)."""


@dataclass(frozen=True, slots=True)
class Stored:
    """An entry taken for delivery. ``tag``: only that webhook's (a replay), or ``""``: every
    webhook taking the type; ``webhook_id``: the one to send, ``""`` to make it from the entry;
    ``done``: the tags it was delivered to already (by an instance that then died)."""

    id: str
    event: WebhookEvent
    tag: str = ""
    webhook_id: str = ""
    done: frozenset[str] = frozenset()

    def webhook_id_for(self, tag: str) -> str:
        return self.webhook_id or f"msg_{self.id}_{tag}"


@dataclass(frozen=True, slots=True)
class Finished:
    """A delivery of entry ``entry`` to webhook ``tag`` over (a ``2xx``, or ``letter``, its dead
    letter): the entry goes once its ``targets`` webhooks are all finished."""

    entry: str
    tag: str
    targets: int
    letter: bytes | None = None


def dead_letter(
    webhook_id: str,
    *,
    url: str,
    tag: str,
    event: WebhookEvent,
    attempts: int,
    last_status: int | None,
    last_error: str,
) -> bytes:
    """A dead letter as stored: the public fields, and the event and tag a replay needs."""
    created = datetime.fromtimestamp(time.time(), UTC).isoformat(timespec="milliseconds")
    return dumps(
        {
            "id": webhook_id,
            "url": url,
            "type": event.type,
            "attempts": attempts,
            "last_status": last_status,
            "last_error": last_error,
            "created_at": created.replace("+00:00", "Z"),
            "tag": tag,
            "event": orjson.Fragment(event.stored()),
        }
    )


def for_replay(letter: bytes) -> tuple[str, str, bytes]:
    """A stored dead letter's webhook-id, webhook tag and stored event."""
    value = orjson.loads(letter)
    return value["id"], value["tag"], dumps(value["event"])


def public(letter: bytes) -> dict[str, Any]:
    """A stored dead letter as ``GET /_bow/webhooks/dead`` shows it."""
    value = orjson.loads(letter)
    return {name: value.get(name) for name in PUBLIC_FIELDS}


class WebhookStore(Protocol):
    """The events waiting for webhooks, and the dead letters. One instance at a time delivers
    (:meth:`hold`); every instance may :meth:`append`."""

    max_backlog: int
    max_dead: int

    async def append(self, events: Sequence[WebhookEvent]) -> int:
        """Store ``events`` in order, durably once it returns; those past ``max_backlog``
        waiting go to the overflow, to become dead letters. The count stored;
        ``BackplaneUnavailable`` when the store does not take them."""
        ...

    async def hold(self) -> bool:
        """Take or keep the right to deliver; whether this instance holds it."""
        ...

    async def release(self) -> None:
        """Give the right to deliver up (at stop), so that another instance takes over now."""
        ...

    async def begin(self) -> None:
        """This instance starts delivering: :meth:`take` gives every pending entry first, those
        of a dead instance included, in order, then new ones."""
        ...

    async def take(self, limit: int, timeout: float) -> list[Stored]:
        """Up to ``limit`` entries, in order, waiting up to ``timeout`` s for one."""
        ...

    async def finish(self, finished: Sequence[Finished]) -> None:
        """Deliveries over: their dead letters kept, the entries delivered to all removed."""
        ...

    async def overflowed(self, limit: int) -> list[Stored]:
        """Up to ``limit`` events refused at the backlog bound, to become dead letters."""
        ...

    async def bury(self, ids: Sequence[str], letters: Sequence[bytes]) -> None:
        """The overflowed ``ids`` gone, their ``letters`` kept."""
        ...

    async def dead(self, limit: int) -> list[bytes]:
        """The oldest ``limit`` dead letters, oldest first (at most ``max_dead`` are kept)."""
        ...

    async def replay(self, webhook_ids: Sequence[str]) -> int:
        """The dead letters of ``webhook_ids`` queued again with the same webhook-id; how many."""
        ...

    async def depth(self) -> int:
        """Entries waiting, taken or not."""
        ...

    async def close(self) -> None: ...
