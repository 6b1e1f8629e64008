"""The Redis layout of the audience index, shared by the criteria job and its reader.

One *generation* of the index, written with a criteria snapshot and swapped with it::

    {ns}:audience:{generation}:b:{pair}   STRING a pyroaring BitMap (``serialize()``): the
                                                 numbers of the listeners holding the pair
    {ns}:audience:{generation}:ids:{chunk}  STRING the ids (JSON, as the criteria fields) of the
                                                 numbers chunk*4096 .. chunk*4096+4095, one a
                                                 line ("\\n"), an empty line for a free number
    {ns}:audience:{generation}:pairs      HASH   pair -> how many listeners hold it
    {{ns}:criteria}:index                 STRING the live generation (see :class:`IndexPointer`)
    {{ns}:criteria}:indexes               HASH   generation -> {"status", "chunks", "expires"}

``pair`` is :func:`pair_token`: the compact JSON of ``[key, value]`` with the value made canonical
for JSON equality (``42.0`` is ``42``; ``true``, ``1`` and ``"1"`` stay three pairs).

Self-contained on purpose (the standard library only): the job ships it to the executors by value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final

CHUNK: Final = 4096
"""Listener ids per ``ids`` string."""


def canonical(value: Any) -> Any:
    """A criterion value as the index keys it: integral floats as integers (JSON equality)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def pair_token(key: str, value: Any) -> str:
    """The name of a (criterion key, value) pair in the index."""
    return json.dumps([key, canonical(value)], ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class IndexLayout:
    """The key names of the audience index of one namespace."""

    namespace: str = "bow"

    @property
    def pointer_key(self) -> str:
        return f"{{{self.namespace}:criteria}}:index"

    @property
    def registry_key(self) -> str:
        return f"{{{self.namespace}:criteria}}:indexes"

    def prefix(self, generation: str) -> str:
        return f"{self.namespace}:audience:{generation}:"

    def bitmap_key(self, generation: str, pair: str) -> str:
        return f"{self.prefix(generation)}b:{pair}"

    def ids_key(self, generation: str, chunk: int) -> str:
        return f"{self.prefix(generation)}ids:{chunk}"

    def pairs_key(self, generation: str) -> str:
        return f"{self.prefix(generation)}pairs"


@dataclass(frozen=True)
class IndexPointer:
    """The live generation: its name, its listeners, the next free number (numbers below it
    without a listener are holes), its listener-criterion pairs (``members``) over ``pairs``
    distinct pairs (and the job's state)."""

    generation: str
    listeners: int
    next: int
    pairs: int = 0
    members: int = 0
    state: str | None = None
    """The job's own record of the generation's listeners (Parquet), for incremental runs."""

    @property
    def chunks(self) -> int:
        return -(-self.next // CHUNK)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes | None) -> IndexPointer | None:
        """The pointer, ``None`` when there is none; ``ValueError`` when it is malformed."""
        if raw is None:
            return None
        try:
            document = json.loads(raw)
            pointer = cls(**document)
        except (ValueError, TypeError) as error:
            raise ValueError(f"malformed audience index pointer {raw!r}: {error}") from None
        if not isinstance(pointer.generation, str) or not isinstance(pointer.next, int):
            raise ValueError(f"malformed audience index pointer {raw!r}")
        return pointer
