"""``message.receipt`` and ``message.undelivered`` (contract section 19): once a receipt is final,
its webhook events, stored once for the cluster whichever instances read the message.

Every instance that read such a message looks at the receipt :data:`~..outbound.receipts.
REPORT_AFTER` seconds after its end (waiting up to ``GIVE_UP_AFTER`` for an instance still
live but late); the first to take the message's lease stores the events, the others nothing.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from typing import Any, Final

import orjson

from ..backplanes import Backplane
from ..core.criteria import ListenerId
from ..core.message import MessageEvent
from ..core.receipts import merged_receipt
from ..runtime.audience_index import AudienceIndex
from ..runtime.whole_base import fill_missed, undelivered
from .events import WebhookEvent
from .service import Webhooks

RECEIPT: Final = "message.receipt"
UNDELIVERED: Final = "message.undelivered"
MAX_LISTENERS: Final = 1_000
"""Listeners one ``message.undelivered`` event lists; more make more events."""


class ReceiptEvents:
    """What :class:`~..outbound.receipts.Receipts` calls once a receipt it reported is over."""

    def __init__(
        self,
        backplane: Backplane,
        webhooks: Webhooks,
        *,
        max_ids: int = 10_000,
        ttl: float = 3_600.0,
        give_up_after: float = 5.0,
        every: float = 0.25,
        index: AudienceIndex | None = None,
        max_listeners: int = 1_000_000,
    ) -> None:
        self._backplane = backplane
        self._webhooks = webhooks
        self._max_ids = max_ids
        self._ttl = ttl
        self._give_up_after = give_up_after
        self._every = every
        self._index = index  # with it, missed and undelivered cover the whole base (section 20)
        self._max_listeners = max_listeners
        self._owner = secrets.token_hex(8)

    def wanted(self) -> bool:
        """Whether any webhook takes either type (else nothing need be called)."""
        return self._webhooks.wants(RECEIPT) or self._webhooks.wants(UNDELIVERED)

    async def __call__(self, message_id: str, event: MessageEvent) -> None:
        ends = (event.accepted_at or time.time()) + event.receipt
        while True:
            reports, live = await self._backplane.reports(message_id)
            receipt = merged_receipt(message_id, reports, live, max_ids=self._max_ids)
            if receipt is None:
                return
            late = [i for i, data in reports.items() if not orjson.loads(data)["f"] and i in live]
            if not late or time.time() >= ends + self._give_up_after:
                break
            await asyncio.sleep(self._every)
        lease = f"receipt-events:{message_id}"
        if not await self._backplane.hold(lease, self._owner, self._ttl):
            return  # another instance stores them
        events: list[WebhookEvent] = []
        if self._webhooks.wants(RECEIPT):
            if self._index is not None:
                await fill_missed(self._index, receipt, reports, self._max_ids)
            events.append(WebhookEvent(RECEIPT, receipt))
        if event.fallback and self._webhooks.wants(UNDELIVERED):
            missed, left_out = await undelivered(self._index, reports, self._max_listeners)
            events += undelivered_events(event, missed, left_out)
        await self._webhooks.emit(events)


def undelivered_events(
    event: MessageEvent, missed: Sequence[ListenerId], left_out: int = 0
) -> list[WebhookEvent]:
    """``message.undelivered`` for ``missed``, at most :data:`MAX_LISTENERS` an event; none
    when nobody missed it. ``left_out``: matching listeners past ``fallback.max_listeners``,
    which every event of the message tells (``"left_out"``)."""
    message = event.message
    about: dict[str, Any] = {"id": event.id, "name": message.name, "payload": message.payload}
    more = {"left_out": left_out} if left_out else {}
    return [
        WebhookEvent(
            UNDELIVERED,
            {"message": about, "listeners": list(missed[start : start + MAX_LISTENERS]), **more},
        )
        for start in range(0, len(missed), MAX_LISTENERS)
    ]
