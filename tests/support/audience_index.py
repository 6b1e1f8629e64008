"""An audience index and its criteria snapshot written in the documented layout
(``bow_gateway.core.audience_layout``), as the criteria job writes them, without Spark: for the
tests of what the gateway answers from it (the job's own runs: tests/test_criteria_job_index.py)."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio
from pyroaring import BitMap

from bow_gateway.core.audience_layout import CHUNK, IndexLayout, IndexPointer, pair_token
from bow_gateway.core.criteria_snapshot import Layout, Live, id_field

Listeners = dict[Any, dict[str, Any]]
"""Each listener id's criteria (without ``__id``)."""


async def write_index(
    client: redis.asyncio.Redis,
    namespace: str,
    generation: str,
    listeners: Listeners,
    holes: int = 0,
) -> list[Any]:
    """A generation and its criteria snapshot, made live; the ids by number (``holes`` free
    numbers first)."""
    layout, criteria = IndexLayout(namespace), Layout(namespace)
    ids = list(listeners)
    bitmaps: dict[str, BitMap] = {}
    for number, (listener_id, values) in enumerate(listeners.items(), holes):
        key, field = criteria.key_of(generation, 1, listener_id)
        await client.hset(key, field, json.dumps(values))
        for name, value in values.items():
            for item in value if isinstance(value, list) else [value]:
                bitmaps.setdefault(pair_token(name, item), BitMap()).add(number)
    for pair, bitmap in bitmaps.items():
        await client.set(layout.bitmap_key(generation, pair), bitmap.serialize())
    lines = [""] * holes + [id_field(listener_id) for listener_id in ids]
    for chunk in range(0, len(lines), CHUNK):
        text = "\n".join(lines[chunk : chunk + CHUNK])
        await client.set(layout.ids_key(generation, chunk // CHUNK), text)
    pointer = IndexPointer(generation, len(ids), len(lines), len(bitmaps))
    await client.mset(
        {layout.pointer_key: pointer.to_json(), criteria.live_key: Live(generation, 1).to_json()}
    )
    return [None] * holes + ids


async def drop_namespace(client: redis.asyncio.Redis, namespace: str) -> None:
    """Every key of ``namespace`` (both of its key shapes) deleted."""
    for pattern in (f"{namespace}:*", f"{{{namespace}*"):
        async for key in client.scan_iter(match=pattern, count=1_000):
            await client.delete(key)
