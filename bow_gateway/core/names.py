"""Message names: the one rule every name is held to, whichever way it comes in (the backend's
inbounds, the clients' publishes), and the names the gateway keeps for itself (``__disconnect``,
``$remote/{sessionId}/rx/...``)."""

from __future__ import annotations

from typing import Final

from .publication import FORBIDDEN_TEXT, forbidden_character

DISCONNECT: Final = "__disconnect"

RESERVED_NAMES: Final = frozenset(
    {"connect", "connect_error", "disconnect", "disconnecting", "newListener", "removeListener"}
    | {"alert"}
)
"""Names Socket.IO clients give their own events, and the gateway's ``alert``: a message under one
of them would fire the clients' lifecycle handlers, so the inbound refuses it."""

GATEWAY_PREFIX: Final = "__"
"""Names starting with it are the gateway's own events (``__position``, ``__gap``): a message may
use only :data:`DISCONNECT`, so that they can be neither forged nor shadowed."""

RESERVED_NAME_ERROR: Final = (
    "{input!r:.100} is reserved: Socket.IO clients (connect, connect_error, disconnect, "
    "disconnecting, newListener, removeListener) and the gateway (alert) use it for their own "
    "events"
)

GATEWAY_NAME_ERROR: Final = (
    "{input!r:.100} is reserved: names starting with __ are the gateway's own events "
    "(a message may use only __disconnect)"
)

SYSTEM_PREFIX: Final = "$"
"""Names whose first level starts with it are the gateway's topics (``clients.md`` section 11):
a message may use only ``$remote/{sessionId}/rx/...``."""

SYSTEM_NAME_ERROR: Final = (
    "{input!r:.100} is reserved: names starting with $ are the gateway's own topics "
    "(a message may use only $remote/{{sessionId}}/rx/...)"
)


def _remote(name: str) -> bool:
    """``$remote/{sessionId}/rx/...``: a non-empty session id, then ``rx``, then a level."""
    levels = name.split("/", 3)
    return len(levels) == 4 and levels[0] == "$remote" and bool(levels[1]) and levels[2] == "rx"


def session_of(name: str) -> str:
    """The session id of a ``$remote/{sessionId}/rx/...`` name ("" for any other name)."""
    return name.split("/", 3)[1] if _remote(name) else ""


CLIENT_NAME_ERROR: Final = (
    "{input!r:.100} is reserved: a client may not publish names starting with __ or $ (the "
    "gateway's own events and topics: only the backend's inbound sends __disconnect and "
    "$remote/{{sessionId}}/rx/...)"
)
EMPTY_LEVEL_ERROR: Final = (
    "{input!r:.100} has an empty level: levels are separated by one /, and only the first may be "
    "empty (Gobbler's leading /): /chat/room1/ and /chat//room1 would be other topics than "
    "/chat/room1"
)
WILDCARD_LEVEL_ERROR: Final = (
    "{input!r:.100} has a + or # level: they are topic filters' wildcards, never a name's"
)


def name_error(name: str, *, client: bool = False) -> str | None:
    """Why ``name`` may not be a message's name (``None``: it may): the one rule of every way a
    message comes in, the backend's inbounds and the clients' publishes (Flywheel's ``P``,
    Gobbler's ``>``; ``client``), whatever the protocol that will carry it.

    - not empty; not a name Socket.IO clients or the gateway reserve (:data:`RESERVED_NAMES`);
    - not the gateway's: ``__`` names but :data:`DISCONNECT`, ``$`` names but
      ``$remote/{sessionId}/rx/...``; a client may send neither of those two either;
    - none of :data:`~.publication.FORBIDDEN_CHARACTERS` (a comma, a control, a line break, a
      bidirectional override), with which a name could forge a frame or a field of the text
      protocols (Gobbler's first line, SSE's lines);
    - no empty level but the first (Gobbler's leading ``/``): no ``//``, no trailing ``/``;
    - no ``+`` or ``#`` level (filters' wildcards).

    Slashes, spaces and any other Unicode are valid.
    """
    if not name:
        return "must not be empty"
    if name in RESERVED_NAMES:
        return RESERVED_NAME_ERROR.format(input=name)
    if name.startswith(GATEWAY_PREFIX):
        if client:
            return CLIENT_NAME_ERROR.format(input=name)
        if name != DISCONNECT:
            return GATEWAY_NAME_ERROR.format(input=name)
    elif name.startswith(SYSTEM_PREFIX):
        if client:
            return CLIENT_NAME_ERROR.format(input=name)
        if not _remote(name):
            return SYSTEM_NAME_ERROR.format(input=name)
    if forbidden_character(name):
        return f"{name!r:.100} {FORBIDDEN_TEXT}"
    if "//" in name or name.endswith("/"):
        return EMPTY_LEVEL_ERROR.format(input=name)
    if ("+" in name or "#" in name) and not {"+", "#"}.isdisjoint(name.split("/")):
        return WILDCARD_LEVEL_ERROR.format(input=name)
    return None
