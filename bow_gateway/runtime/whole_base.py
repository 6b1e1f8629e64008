"""A receipt's ``missed`` and a fallback's ``message.undelivered`` over the whole base (contract
section 20): every listener of the audience index that the message's audience matches, not only
those its ``__id`` queries name, less those an instance reached."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

from ..core.criteria import ListenerId
from ..core.message import id_text
from ..core.receipts import reached_texts, reported_audience, unreached
from .audience_index import AudienceIndex

BATCH: Final = 4_096
"""Ids compared between two turns of the event loop."""


async def fill_missed(
    index: AudienceIndex, receipt: dict[str, Any], reports: Mapping[str, bytes], max_ids: int
) -> None:
    """Set ``receipt``'s ``missed`` to the listeners of the index matching the message's
    audience (and those its ``__id`` queries name) that no socket was delivered it: ``null``
    past ``max_ids``, or when the delivered ids are (the reports carry no audience: unchanged)."""
    audience = reported_audience(reports)
    found = None if audience is None else await index.matching(audience)
    if found is None:
        return
    listed = receipt["listeners"]
    delivered, named = listed["delivered"], listed["missed"]  # named: the __id ones
    if delivered is None or named is None or len(found) > max_ids + len(delivered):
        listed["missed"] = None
        return
    reached = {id_text(listener_id) for listener_id in delivered}
    ids = await index.listener_ids(found.listeners, len(found))
    missed = {id_text(i): i for i in ids if id_text(i) not in reached}
    missed.update((id_text(i), i) for i in named)
    listed["missed"] = None if len(missed) > max_ids else list(missed.values())


async def undelivered(
    index: AudienceIndex | None, reports: Mapping[str, bytes], max_listeners: int = 1_000_000
) -> tuple[list[ListenerId], int]:
    """The listeners a fallback message did not reach: with a live index, those of the base
    its audience matches (at most ``max_listeners`` of them) and those its ``__id`` queries
    name; without, only the latter. And how many matching listeners were left out."""
    audience = None if index is None else reported_audience(reports)
    found = None if index is None or audience is None else await index.matching(audience)
    if found is None:
        return unreached(reports), 0
    assert index is not None
    ids = await index.listener_ids(found.listeners, max_listeners)
    reached = reached_texts(reports)
    missed: dict[str, ListenerId] = {}
    for start in range(0, len(ids), BATCH):  # the loop let go between batches
        for listener_id in ids[start : start + BATCH]:
            text = id_text(listener_id)
            if text not in reached:
                missed[text] = listener_id
        await asyncio.sleep(0)
    for listener_id in unreached(reports):  # named, perhaps not in the base
        missed.setdefault(id_text(listener_id), listener_id)
    return list(missed.values()), max(0, len(found) - max_listeners)
