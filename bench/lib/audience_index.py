"""An audience index and its criteria snapshot written in the documented layout
(``bow_gateway.core.audience_layout``, ``bow_gateway.core.criteria_snapshot``) from listeners'
criteria, in pure Python with pyroaring and a synchronous redis-py client, without Spark (as
``tests/support/audience_index.py``'s ``write_index``, but pipelined and with the job's bucket
count, for a million listeners): for ``reach_bench.py``. The criteria job's own timing is
``criteria_job_bench.py``'s.

Also the audiences ``reach_bench.py`` sends: random queries drawn from the listeners' real criteria.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import orjson
import redis
from pyroaring import BitMap

from bow_gateway.core.audience_layout import CHUNK, IndexLayout, IndexPointer, pair_token
from bow_gateway.core.criteria_snapshot import Layout, Live, bucket_count, bucket_of, id_field

Criteria = dict[str, Any]
BATCH = 500
"""Commands per pipeline round trip."""


def bitmaps_of(criteria: Sequence[Criteria]) -> dict[str, BitMap]:
    """Each (key, value) pair's listeners, by number (the position in ``criteria``)."""
    tokens: dict[tuple[str, Any, type], str] = {}
    numbers: dict[str, list[int]] = {}
    for number, values in enumerate(criteria):
        for name, value in values.items():
            for item in value if isinstance(value, list) else (value,):
                known = (name, item, type(item))  # True and 1 are two pairs
                token = tokens.get(known)
                if token is None:
                    token = tokens[known] = pair_token(name, item)
                    numbers[token] = []
                numbers[token].append(number)
    return {token: BitMap(listed) for token, listed in numbers.items()}


def write_index(
    client: redis.Redis,
    namespace: str,
    generation: str,
    ids: Sequence[Any],
    criteria: Sequence[Criteria],
) -> tuple[IndexPointer, dict[str, BitMap]]:
    """Generation ``generation`` of ``namespace``'s index (listener ``n`` is ``ids[n]`` with
    ``criteria[n]``) and its criteria snapshot of the same name, both made live; the bitmaps."""
    layout = IndexLayout(namespace)
    bitmaps = bitmaps_of(criteria)
    pipe = client.pipeline(transaction=False)
    for n, (pair, bitmap) in enumerate(bitmaps.items(), 1):
        pipe.set(layout.bitmap_key(generation, pair), bitmap.serialize())
        if n % BATCH == 0:
            pipe.execute()
    counts = {pair: len(bitmap) for pair, bitmap in bitmaps.items()}
    for start in range(0, len(counts), 10_000):
        part = dict(list(counts.items())[start : start + 10_000])
        pipe.hset(layout.pairs_key(generation), mapping=part)  # type: ignore[arg-type]
    pipe.execute()
    fields = [id_field(listener_id) for listener_id in ids]
    for chunk in range(0, len(fields), CHUNK):
        pipe.set(
            layout.ids_key(generation, chunk // CHUNK), "\n".join(fields[chunk : chunk + CHUNK])
        )
    pipe.execute()
    buckets = write_snapshot(client, namespace, generation, fields, criteria)
    members = sum(counts.values())
    pointer = IndexPointer(generation, len(ids), len(ids), len(bitmaps), members)
    snapshot = Layout(namespace)
    client.mset(
        {
            layout.pointer_key: pointer.to_json(),
            snapshot.live_key: Live(generation, buckets).to_json(),
        }
    )
    return pointer, bitmaps


def write_snapshot(
    client: redis.Redis,
    namespace: str,
    snapshot: str,
    fields: Sequence[str],
    criteria: Sequence[Criteria],
) -> int:
    """Each listener's criteria (a JSON object) in its bucket's hash; the bucket count."""
    layout = Layout(namespace)
    buckets = bucket_count(len(fields))
    held: list[dict[str, bytes]] = [{} for _ in range(buckets)]
    for field, values in zip(fields, criteria, strict=True):
        held[bucket_of(field, buckets)][field] = orjson.dumps(values)
    pipe = client.pipeline(transaction=False)
    for bucket, mapping in enumerate(held):
        if mapping:
            pipe.hset(layout.bucket_key(snapshot, bucket), mapping=mapping)  # type: ignore[arg-type]
        if (bucket + 1) % BATCH == 0:
            pipe.execute()
    pipe.execute()
    return buckets


def drop(client: redis.Redis, namespace: str) -> None:
    """Every key of ``namespace`` (both of its key shapes)."""
    for pattern in (f"{namespace}:*", f"{{{namespace}*"):
        keys = list(client.scan_iter(match=pattern, count=10_000))
        for start in range(0, len(keys), 10_000):
            client.unlink(*keys[start : start + 10_000])


class Audiences:
    """Random audiences of 1-3 queries of 1-3 predicates, drawn from real listeners' criteria
    (so that most match someone), some naming a listener by ``__id``, some values random."""

    def __init__(self, ids: Sequence[Any], criteria: Sequence[Criteria], seed: int = 7) -> None:
        self.ids, self.criteria = ids, criteria
        self.rng = random.Random(seed)
        self.domains: dict[str, list[Any]] = {}
        for values in criteria[:: max(1, len(criteria) // 20_000)]:
            for name, value in values.items():
                self.domains.setdefault(name, []).extend(_items(value))

    def query(self) -> dict[str, Any]:
        rng = self.rng
        n = rng.randrange(len(self.ids))
        own = self.criteria[n]
        names = rng.sample(sorted(own), min(len(own), rng.randint(1, 3)))
        query = {name: rng.choice(_items(own[name])) for name in names}
        if rng.random() < 0.2:  # a value of another listener: may match nobody with the rest
            name = rng.choice(sorted(self.domains))
            query[name] = rng.choice(self.domains[name])
        if rng.random() < 0.1:  # a listener by id, perhaps with a predicate it fails
            query = {"__id": self.ids[n], **dict(list(query.items())[: rng.randint(0, 1)])}
        return query

    def audience(self) -> list[dict[str, Any]]:
        return [self.query() for _ in range(self.rng.randint(1, 3))]


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
