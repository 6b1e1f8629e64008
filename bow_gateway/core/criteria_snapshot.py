"""The Redis layout of precomputed criteria, shared by the Spark job and the middleware.

A *snapshot* holds every listener's criteria in bucket hashes::

    {ns}:criteria:{snapshot}:{bucket}   HASH  field = the listener id as compact JSON (1 and "1"
                                              differ), value = its criteria (without __id) as a
                                              JSON array of values in the order of the live
                                              pointer's "columns", null where a key is absent
                                              (trailing nulls left out): the keys, the same in
                                              every listener, are stored once; in a column with
                                              codes, a string may be stored as its number there
    {{ns}:criteria}:live                STRING {"snapshot": ..., "buckets": n, "layout": 2,
                                              "columns": [...], "codes": [[...] or null, ...],
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

Layouts of the values, named by the pointer: without "layout" and "keys", JSON objects (0);
"keys" without "layout", arrays by position (1); "layout": 2, arrays by position whose string
columns may hold codes: ``["pro",["author"]]`` is ``[1,[0]]`` with ``"codes":
[["free","pro"],["author"]]`` (a string that has no code stays a string). A gateway too old to
know "columns" reads a layout-2 value as an object and refuses it; a newer layout than this
reader knows is refused when the pointer is read.
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


CODED_LAYOUT: Final = 2
"""The pointer's "layout" when string columns may hold codes (see above)."""

Codes = tuple[tuple[str, ...] | None, ...]
"""Per column (in the order of the keys), its strings by code, or ``None``: a column without."""


@dataclass(frozen=True)
class Live:
    """What the live pointer says: the snapshot to read, its bucket count, the job's state."""

    snapshot: str
    buckets: int
    state: str | None = None
    keys: tuple[str, ...] | None = None
    """The criteria keys of the values' positions; ``None``: each value is a JSON object."""
    codes: Codes | None = None
    """Per key, the strings its codes stand for (layout 2, with ``keys``); ``None``: no codes."""

    def to_json(self) -> str:
        document: dict[str, Any] = {"snapshot": self.snapshot, "buckets": self.buckets}
        if self.codes is not None:
            assert self.keys is not None and len(self.codes) == len(self.keys)
            document["layout"] = CODED_LAYOUT
            document["columns"] = list(self.keys)
            document["codes"] = [None if table is None else list(table) for table in self.codes]
        elif self.keys is not None:
            document["keys"] = list(self.keys)
        if self.state is not None:
            document["state"] = self.state
        return json.dumps(document, separators=(",", ":"))

    def criteria(self, raw: str | bytes) -> dict[str, Any]:
        """A listener's criteria from the value stored for it in this snapshot."""
        return criteria_of(raw, self.keys, self.codes)

    @classmethod
    def from_json(cls, raw: str | bytes | None) -> Live | None:
        """The pointer, or ``None`` when there is none; ``ValueError`` when it is malformed
        or of a layout this reader does not know."""
        if raw is None:
            return None
        try:
            document = json.loads(raw)
            snapshot, buckets = document["snapshot"], document["buckets"]
            state, layout = document.get("state"), document.get("layout")
            if layout == CODED_LAYOUT:
                keys, codes = document["columns"], document["codes"]
            else:
                keys, codes = document.get("keys"), None
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(f"malformed live criteria pointer {raw!r}: {error}") from None
        if layout is not None and layout != CODED_LAYOUT:
            raise ValueError(
                f"the live criteria pointer has layout {layout!r}, which this gateway does not"
                f" read (it reads 1 and {CODED_LAYOUT}): upgrade it"
            )
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
        if codes is not None and not _are_codes(codes, keys):
            raise ValueError(f"malformed live criteria pointer {raw!r}: bad codes")
        return cls(
            snapshot,
            buckets,
            state,
            None if keys is None else tuple(keys),
            None if codes is None else tuple(None if t is None else tuple(t) for t in codes),
        )


def _are_codes(codes: Any, keys: Any) -> bool:
    return (
        isinstance(codes, list)
        and isinstance(keys, list)
        and len(codes) == len(keys)
        and all(
            table is None
            or (isinstance(table, list) and all(isinstance(s, str) and s for s in table))
            for table in codes
        )
    )


def criteria_of(
    raw: str | bytes, keys: Sequence[str] | None, codes: Codes | None = None
) -> dict[str, Any]:
    """Criteria from a stored value: an array of values in the order of ``keys`` (their strings
    possibly coded, see :class:`Live`), or an object."""
    value = json.loads(raw)
    if keys is None:
        if not isinstance(value, dict):
            raise ValueError(f"stored criteria {raw!r} are not a JSON object")
        return value
    if not isinstance(value, list) or len(value) > len(keys):
        raise ValueError(f"stored criteria {raw!r} do not fit the keys {list(keys)}")
    if codes is None:
        return {key: item for key, item in zip(keys, value, strict=False) if item is not None}
    found: dict[str, Any] = {}
    try:
        for key, item, table in zip(keys, value, codes, strict=False):
            if item is None:
                continue
            if table is not None:
                if type(item) is int:
                    item = table[_index(item)]
                elif isinstance(item, list):
                    item = [table[_index(x)] if type(x) is int else x for x in item]
            found[key] = item
    except IndexError:
        raise ValueError(f"stored criteria {raw!r} hold a code the pointer has not") from None
    return found


def _index(code: int) -> int:
    if code < 0:
        raise IndexError(code)
    return code


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
