"""Topics (section 11 of ``clients.md``): MQTT 3.1.1 topic filters, and the index of who holds them.

A message's name is its topic: levels separated by ``/`` (a leading ``/`` is an empty first
level). A filter matches names level by level: ``+`` is any one level, ``#`` (alone, last) any
number of levels, none included (``a/#`` matches ``a``). Names whose first level starts with ``$``
are the gateway's: no client may hold a filter for them, and neither ``+`` nor ``#`` at the first
level matches them.

Every outbound keeps a :class:`~.topic_index.TopicIndex` of its connections' filters.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final, TypeVar

S = TypeVar("S", bound=Hashable)

SEPARATOR: Final = "/"
ONE_LEVEL: Final = "+"
ALL_LEVELS: Final = "#"
SYSTEM_PREFIX: Final = "$"

MAX_FILTER_BYTES: Final = 1_024
"""The longest filter, in UTF-8 bytes: each level of a filter is a node of the index."""
MAX_FILTER_LEVELS: Final = 32
"""The most levels in one filter (``a/b/#`` has 3): with ``max_filters``, what one connection can
make the index hold. Longer names are still matched by a filter ending in ``#``."""


def parse_filter(text: object, *, system: bool = False) -> tuple[str, ...]:
    """The levels of a topic filter a client may hold (``system``: or the gateway's own, an
    enricher's, which may name ``$`` topics); ``ValueError`` says what is wrong.

    MQTT 3.1.1 (4.7): ``+`` and ``#`` occupy a whole level, ``#`` only the last; a filter is not
    empty and holds no NUL. Beyond MQTT: a first level starting with ``$`` names the gateway's
    topics, which no client may subscribe to, and a filter has at most
    :data:`MAX_FILTER_LEVELS` levels and :data:`MAX_FILTER_BYTES` bytes.
    """
    if not isinstance(text, str):
        raise ValueError(f"a filter is a string, not {type(text).__name__}")
    if not text:
        raise ValueError("a filter must not be empty")
    shown = repr(text if len(text) <= 64 else text[:64] + "...")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILTER_BYTES:
        raise ValueError(f"{shown}: a filter has at most {MAX_FILTER_BYTES} bytes")
    if "\x00" in text:
        raise ValueError(f"{shown}: a filter must not contain NUL (U+0000)")
    levels = tuple(text.split(SEPARATOR))
    if len(levels) > MAX_FILTER_LEVELS:
        raise ValueError(f"{shown}: a filter has at most {MAX_FILTER_LEVELS} levels")
    last = len(levels) - 1
    for position, level in enumerate(levels):
        if ALL_LEVELS in level:
            if level != ALL_LEVELS:
                raise ValueError(f"{shown}: # must be a whole level (as in 'a/#')")
            if position != last:
                raise ValueError(f"{shown}: # must be the last level (as in 'a/#')")
        elif ONE_LEVEL in level and level != ONE_LEVEL:
            raise ValueError(f"{shown}: + must be a whole level (as in 'a/+/c')")
    if levels[0].startswith(SYSTEM_PREFIX) and not system:
        raise ValueError(
            f"{shown}: names starting with $ are the gateway's own; no client subscribes to them"
        )
    return levels


def is_system_name(name: str) -> bool:
    """Whether ``name``'s first level starts with ``$`` (the gateway's topics)."""
    return name.startswith(SYSTEM_PREFIX)


def filter_matches(levels: tuple[str, ...], name: str) -> bool:
    """Whether a parsed filter matches ``name`` (one filter; the index answers for many)."""
    parts = name.split(SEPARATOR)
    if is_system_name(name) and levels[0] in (ONE_LEVEL, ALL_LEVELS):
        return False
    for position, level in enumerate(levels):
        if level == ALL_LEVELS:
            return True
        if position >= len(parts) or (level != ONE_LEVEL and level != parts[position]):
            return False
    return len(levels) == len(parts)
