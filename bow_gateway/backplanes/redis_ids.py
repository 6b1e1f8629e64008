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


def stream_entries(response: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The ``(id, fields)`` entries of an XREAD on one stream, whatever shape redis-py chose."""
    if not response:
        return []
    (entries,) = response.values() if isinstance(response, dict) else [s[1] for s in response]
    if entries and isinstance(entries[0], list):  # RESP3 with legacy_responses: one level more
        (entries,) = entries
    return list(entries)


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
