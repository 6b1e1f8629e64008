"""The Redis layout of precomputed criteria, shared by the Spark job and the middleware.

A *snapshot* holds every listener's criteria in bucket hashes::

    {ns}:criteria:{snapshot}:{bucket}   HASH  field = the listener id as compact JSON (1 and "1"
                                              differ), value = its criteria (without __id) as a
                                              JSON array of values in the order of the live
                                              pointer's "keys", null where a key is absent
                                              (trailing nulls left out): the keys, the same in
                                              every listener, are stored once
    {{ns}:criteria}:live                STRING {"snapshot": ..., "buckets": n, "keys": [...],
                                              "state": ...}; no "state" while an incremental
                                              run writes into the live snapshot
    {ns}:criteria:changes               channel: {"snapshot": ...} or {"ids": [...]}
    {{ns}:criteria}:lock                STRING the running job's token (SET NX PX, renewed)
    {{ns}:criteria}:snapshots           HASH  snapshot -> {"buckets", "status", "expires"}

``bucket = crc32(field) mod n`` (``zlib.crc32`` here, Spark SQL's ``crc32`` in the job: both hash
the UTF-8 bytes of the field). With about 100 listeners per bucket each hash stays a listpack in
Redis (``hash-max-listpack-entries``, ``hash-max-listpack-value``), about 70-100 bytes per listener
instead of ~160 for one key each, and the gateway reads a listener with one ``HGET``. The buckets
spread over all slots of a Redis Cluster and the control keys share one (a hash tag), so no
command touches two slots; the job's writers send each bucket to the node that holds it.

The field is JSON as Spark's ``to_json`` writes it: non-ASCII characters as they are, control
characters as ``\\u00XX`` with upper-case hex (:func:`id_field`).
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from .criteria import ListenerId, is_listener_id

DEFAULT_NAMESPACE: Final = "bow"
LISTENERS_PER_BUCKET: Final = 100

_LOWER_HEX_ESCAPE: Final = re.compile(r"\\\\|\\u[0-9a-f]{4}")


def id_field(listener_id: ListenerId) -> str:
    """The hash field of a listener id: compact JSON, byte for byte what the Spark job writes."""
    if not is_listener_id(listener_id):
        raise ValueError(f"not a listener id: {listener_id!r}")
    if isinstance(listener_id, float) and listener_id.is_integer():
        listener_id = int(listener_id)  # 42.0 is the listener 42, as everywhere in the gateway
    text = json.dumps(listener_id, ensure_ascii=False, separators=(",", ":"))
    return _LOWER_HEX_ESCAPE.sub(_upper_hex, text)


def _upper_hex(match: re.Match[str]) -> str:
    escape = match.group()
    return escape if escape == "\\\\" else escape[:2] + escape[2:].upper()


def bucket_of(field: str, buckets: int) -> int:
    """The bucket of a field: ``crc32`` of its UTF-8 bytes, modulo the bucket count."""
    return zlib.crc32(field.encode()) % buckets


def bucket_count(listeners: int, per_bucket: int = LISTENERS_PER_BUCKET) -> int:
    """How many buckets hold ``listeners`` at about ``per_bucket`` each (at least one)."""
    return max(1, math.ceil(listeners / per_bucket))


@dataclass(frozen=True)
class Layout:
    """The key names of one namespace."""

    namespace: str = DEFAULT_NAMESPACE

    @property
    def prefix(self) -> str:
        return f"{self.namespace}:criteria:"

    @property
    def _control(self) -> str:
        # One hash tag for the keys that a script touches together (the lock and the pointer),
        # so that they share a Redis Cluster slot; the buckets spread over all slots.
        return f"{{{self.namespace}:criteria}}:"

    @property
    def live_key(self) -> str:
        return f"{self._control}live"

    @property
    def changes_channel(self) -> str:
        return f"{self.prefix}changes"

    @property
    def lock_key(self) -> str:
        return f"{self._control}lock"

    @property
    def registry_key(self) -> str:
        return f"{self._control}snapshots"

    def bucket_prefix(self, snapshot: str) -> str:
        return f"{self.prefix}{snapshot}:"

    def bucket_key(self, snapshot: str, bucket: int) -> str:
        return f"{self.prefix}{snapshot}:{bucket}"

    def key_of(self, snapshot: str, buckets: int, listener_id: ListenerId) -> tuple[str, str]:
        """The (key, field) that hold a listener's criteria in a snapshot."""
        field = id_field(listener_id)
        return self.bucket_key(snapshot, bucket_of(field, buckets)), field


@dataclass(frozen=True)
class Live:
    """What the live pointer says: the snapshot to read, its bucket count, the job's state."""

    snapshot: str
    buckets: int
    state: str | None = None
    keys: tuple[str, ...] | None = None
    """The criteria keys of the values' positions; ``None``: each value is a JSON object."""

    def to_json(self) -> str:
        document: dict[str, Any] = {"snapshot": self.snapshot, "buckets": self.buckets}
        if self.keys is not None:
            document["keys"] = list(self.keys)
        if self.state is not None:
            document["state"] = self.state
        return json.dumps(document, separators=(",", ":"))

    def criteria(self, raw: str | bytes) -> dict[str, Any]:
        """A listener's criteria from the value stored for it in this snapshot."""
        return criteria_of(raw, self.keys)

    @classmethod
    def from_json(cls, raw: str | bytes | None) -> Live | None:
        """The pointer, or ``None`` when there is none; ``ValueError`` when it is malformed."""
        if raw is None:
            return None
        try:
            document = json.loads(raw)
            snapshot, buckets = document["snapshot"], document["buckets"]
            state, keys = document.get("state"), document.get("keys")
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(f"malformed live criteria pointer {raw!r}: {error}") from None
        if not isinstance(snapshot, str) or not snapshot or ":" in snapshot:
            raise ValueError(f"malformed live criteria pointer {raw!r}: bad snapshot")
        if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 1:
            raise ValueError(f"malformed live criteria pointer {raw!r}: bad bucket count")
        if state is not None and not isinstance(state, str):
            raise ValueError(f"malformed live criteria pointer {raw!r}: bad state")
        if keys is not None and not (
            isinstance(keys, list) and all(isinstance(key, str) and key for key in keys)
        ):
            raise ValueError(f"malformed live criteria pointer {raw!r}: bad keys")
        return cls(snapshot, buckets, state, None if keys is None else tuple(keys))


def criteria_of(raw: str | bytes, keys: Sequence[str] | None) -> dict[str, Any]:
    """Criteria from a stored value: an array of values in the order of ``keys``, or an object."""
    value = json.loads(raw)
    if keys is None:
        if not isinstance(value, dict):
            raise ValueError(f"stored criteria {raw!r} are not a JSON object")
        return value
    if not isinstance(value, list) or len(value) > len(keys):
        raise ValueError(f"stored criteria {raw!r} do not fit the keys {list(keys)}")
    return {key: item for key, item in zip(keys, value, strict=False) if item is not None}


def snapshot_message(snapshot: str) -> str:
    """The notification that a snapshot went live: every listener may have changed."""
    return json.dumps({"snapshot": snapshot}, separators=(",", ":"))


def ids_message(fields: list[str]) -> str:
    """The notification that these listeners (given as their hash fields) changed."""
    return '{"ids":[' + ",".join(fields) + "]}"


def parse_change(raw: str | bytes) -> list[ListenerId] | None:
    """A notification: ``None`` for a new snapshot, else the listener ids that changed."""
    document = json.loads(raw)
    if isinstance(document, dict) and isinstance(document.get("snapshot"), str):
        return None
    if isinstance(document, dict) and isinstance(document.get("ids"), list):
        ids = document["ids"]
        if all(is_listener_id(listener_id) for listener_id in ids):
            return list(ids)
    raise ValueError(f"not a criteria notification: {raw!r}")
