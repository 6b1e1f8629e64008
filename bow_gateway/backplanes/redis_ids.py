"""Stream ids and positions of the Redis backplane, and what its readers keep of them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

StreamId = tuple[int, int]
POSITION: Final = re.compile(r"([0-9a-z]{1,32})\.([0-9]{1,20})-([0-9]{1,20})")
"""A position: ``"{epoch}.{milliseconds}-{sequence}"``."""
_MAX_SEQUENCE: Final = 2**64 - 1


@dataclass
class Cursor:
    """How far a reader has read: the last id, how many entries the stream had added by then,
    and the epoch those belong to."""

    last: StreamId = (0, 0)
    seen: int = 0
    epoch: str = ""


@dataclass(frozen=True, slots=True)
class Look:
    """What the ``look`` script saw: the epoch (and where it starts), and the stream's state."""

    epoch: str
    after: StreamId
    added_then: int
    last: StreamId
    added: int | None
    first: StreamId | None
    length: int


def stream_entries(response: Any, field: bytes) -> list[tuple[bytes, bytes | None]]:
    """``(id, the value of field or None)`` of each entry of an XREAD on one stream, read
    unparsed (:func:`raw_reply`): ``[[key, [[id, [field, value, ...]], ...]]]``, or with RESP3 a
    map of the key to its entries."""
    if not response:
        return []
    (entries,) = response.values() if isinstance(response, dict) else [s[1] for s in response]
    return [(entry_id, _value(fields, field)) for entry_id, fields in entries]


def _value(fields: list[bytes], field: bytes) -> bytes | None:
    if fields and fields[0] == field:  # as the backplane writes it: its field first
        return fields[1]
    for index in range(2, len(fields) - 1, 2):
        if fields[index] == field:
            return fields[index + 1]
    return None


def raw_reply(response: Any, **options: Any) -> Any:
    """A response callback that leaves the reply as Redis sent it (redis-py's XREAD callback
    made a dict of each entry's fields: a tenth of the backplane's reading, for one field)."""
    return response


def parse_id(entry_id: bytes | str) -> StreamId:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    milliseconds, _, sequence = text.partition("-")
    return int(milliseconds), int(sequence or 0)


def as_text(entry_id: bytes | str) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


def format_id(stream_id: StreamId) -> str:
    return f"{stream_id[0]}-{stream_id[1]}"


def id_before(stream_id: StreamId) -> StreamId:
    """The greatest id below ``stream_id`` (reading after it reads ``stream_id`` first)."""
    milliseconds, sequence = stream_id
    return (milliseconds, sequence - 1) if sequence else (milliseconds - 1, _MAX_SEQUENCE)
