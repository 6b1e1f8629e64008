"""Gobbler's fields of a message (``clients.md`` section 14): its application headers and the
publisher's user, application and message ids, checked and bounded where a message is validated.

Most messages have none: :class:`Publication` is one optional object of a message, and the checks
run only when a message mapping has one of :data:`PUBLICATION_KEYS`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, NamedTuple


class Publication(NamedTuple):
    """What Gobbler's message format carries besides the body (``clients.md`` section 14): the
    application headers and who published it. One object, absent from most messages; a tuple,
    a third of a frozen dataclass's cost to build."""

    headers: dict[str, str]
    user_id: str | None = None
    application_id: str | None = None
    message_id: str | None = None


PUBLICATION_KEYS: Final = ("headers", "user_id", "application_id", "message_id")
"""The keys of a message mapping that make its :class:`Publication`, in its fields' order."""
PUBLICATION_KEY_SET: Final = frozenset(PUBLICATION_KEYS)
MAX_HEADERS: Final = 64
MAX_HEADER_BYTES: Final = 8_192
MAX_ID_LENGTH: Final = 256

FORBIDDEN_CHARACTERS: Final = re.compile(
    "[,\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]"
)
"""What no message name or publisher id may hold: a comma (Gobbler's first line separates its
fields with them), a C0 control (line breaks included), DEL, a C1 control (``NEL`` included),
JavaScript's line and paragraph separators, and the bidirectional marks, embeddings, overrides
and isolates (``U+202E`` shows a name backwards). Clients split their frames on the first
ones, and people read names and ids: none of them is ever needed in either."""
FORBIDDEN_TEXT: Final = (
    "must not hold a comma or a line break, nor a control or bidirectional character "
    "(text protocols separate their fields with them: Gobbler's lines and the commas of its "
    "first line, SSE's lines)"
)


def forbidden_character(text: str) -> bool:
    """Whether ``text`` holds one of :data:`FORBIDDEN_CHARACTERS` (ASCII first: no regex)."""
    if text.isascii():
        return "," in text or not text.isprintable()
    return FORBIDDEN_CHARACTERS.search(text) is not None


def as_mapping(publication: Publication) -> dict[str, Any]:
    """The parts of ``publication`` that are set, under a message mapping's keys (what an
    enricher receives; :func:`read_publication` reads it back)."""
    parts = zip(
        PUBLICATION_KEYS[1:],
        (publication.user_id, publication.application_id, publication.message_id),
        strict=True,
    )
    mapping: dict[str, Any] = {"headers": publication.headers} if publication.headers else {}
    mapping.update((key, value) for key, value in parts if value is not None)
    return mapping


def read_publication(
    value: Mapping[str, Any], prefix: str, max_headers: int, max_header_bytes: int, max_id: int
) -> Publication | None:
    """The :class:`Publication` of a message mapping (``None`` when every part is absent or
    ``None``); ``ValueError`` names the faulty field, after ``prefix`` (a batch's index)."""
    where = f"{prefix}." if prefix else ""
    headers = value.get("headers")
    if headers is None:
        headers = {}
    elif not isinstance(headers, Mapping):
        raise ValueError(
            f"{where}headers: must be a mapping of names to strings, not {type(headers).__name__}"
        )
    else:
        headers = _headers(headers, where, max_headers, max_header_bytes)
    ids = [_identifier(value.get(key), where, key, max_id) for key in PUBLICATION_KEYS[1:]]
    if not headers and ids == [None, None, None]:
        return None
    return Publication(headers, *ids)


def _headers(
    headers: Mapping[Any, Any], where: str, max_headers: int, max_bytes: int
) -> dict[str, str]:
    """A copy of valid headers: at most ``max_headers`` non-empty string names to strings, of
    at most ``max_bytes`` in all (names and values, UTF-8)."""
    if len(headers) > max_headers:
        raise ValueError(f"{where}headers: at most {max_headers} headers, not {len(headers)}")
    checked: dict[str, str] = {}
    size = 0
    for name, text in headers.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}headers: a name must be a non-empty string, not {name!r:.60}")
        if not isinstance(text, str):
            kind = type(text).__name__
            raise ValueError(f"{where}headers.{name:.60}: must be a string, not {kind}")
        size += len(name.encode()) + len(text.encode())
        checked[str(name)] = str(text)  # plain strings, not a multidict's istr
    if size > max_bytes:
        raise ValueError(
            f"{where}headers: at most {max_bytes} bytes of names and values (UTF-8), not {size}"
        )
    return checked


def _identifier(value: Any, where: str, key: str, max_length: int) -> str | None:
    """A publisher's id: ``None``, or a non-empty string of at most ``max_length`` characters
    without a comma, a line break or another of :data:`FORBIDDEN_CHARACTERS` (Gobbler's format
    separates its fields with them)."""
    if value is None:
        return None
    if type(value) is not str or not value or len(value) > max_length:
        raise ValueError(f"{where}{key}: {_id_fault(value, max_length)}")
    if forbidden_character(value):
        raise ValueError(f"{where}{key}: {FORBIDDEN_TEXT}: {value!r:.60}")
    return value


def _id_fault(value: Any, max_length: int) -> str:
    if type(value) is not str or not value:
        return f"must be a non-empty string, not {value!r:.60}"
    return f"at most {max_length} characters, not {len(value)}"
