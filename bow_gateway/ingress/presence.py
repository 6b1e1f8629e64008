"""Presence (contract section 18): ``POST {api.prefix}/presence``, the authenticated listeners
whose criteria match an audience now, on every instance, a page at a time in the order of their
ids' JSON text, with exact counts; ``POST {api.prefix}/online``, which of some ids have a socket
anywhere. Asked and answered as ``/count`` is: every live instance answers within
``api.count_timeout`` (``complete`` says whether all did)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson

from ..core.criteria import ListenerId, is_listener_id
from ..core.index import Query
from ..core.message import id_text, validate_message

logger = logging.getLogger("bow_gateway.control")

MAX_LIMIT: Final = 10_000
MAX_IDS: Final = 10_000
MAX_CURSOR: Final = 4_096  # characters of a cursor: an id's JSON text
PROTOCOLS: Final = ("socketio", "flywheel", "sse", "gobbler")
"""The protocols every answer counts, 0 where none is connected."""


def check_presence(
    body: Any, *, max_queries: int = 1_000, max_predicates: int = 32
) -> tuple[list[Query], int, str | None]:
    """``{"audience", "limit"?, "cursor"?}``: the audience checked as a message's, the page's
    size (1 to 10,000, 1,000 by default) and where it starts; ``ValueError`` naming the field."""
    if not isinstance(body, Mapping):
        raise ValueError('the body must be {"audience": [...], "limit": n, "cursor": "..."}')
    unknown = sorted(str(key)[:60] for key in body if key not in ("audience", "limit", "cursor"))
    if unknown:
        raise ValueError(f"{unknown[0]}: Unknown field.")
    if "audience" not in body:
        raise ValueError("audience: Missing data for required field.")
    limit = body.get("limit", 1_000)
    if type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit: must be an integer from 1 to {MAX_LIMIT}")
    cursor = body.get("cursor")
    if cursor is not None and (not isinstance(cursor, str) or not 0 < len(cursor) <= MAX_CURSOR):
        raise ValueError("cursor: must be a previous answer's next (a string), or null")
    message = {"name": "presence", "audience": body["audience"]}
    audience = validate_message(
        message, max_queries=max_queries, max_predicates=max_predicates
    ).audience
    return audience, limit, cursor


def check_online(body: Any) -> list[ListenerId]:
    """``{"ids": [...]}``: up to 10,000 listener ids; ``ValueError`` naming the fault."""
    if not isinstance(body, Mapping) or set(body) != {"ids"}:
        raise ValueError('the body must be {"ids": [...]}')
    ids = body["ids"]
    if not isinstance(ids, list):
        raise ValueError("ids: must be a list of listener ids")
    if len(ids) > MAX_IDS:
        raise ValueError(f"ids: at most {MAX_IDS}, not {len(ids)}")
    for index, listener_id in enumerate(ids):
        if not is_listener_id(listener_id):
            raise ValueError(
                f"ids.{index}: not a listener id (a non-empty string or a finite number)"
            )
    return ids


def merged_presence(answers: Iterable[bytes], complete: bool, limit: int) -> dict[str, Any]:
    """The instances' pages as one: the first ``limit`` ids of them all, ``next`` when more
    follow (the JSON text of the last one listed), counts summed."""
    ids: dict[str, ListenerId] = {}
    more, sockets, protocols = False, 0, Counter[str]()
    for data in answers:
        try:
            answer = orjson.loads(data)
            found = {id_text(listener_id): listener_id for listener_id in answer["ids"]}
            count, kinds, truncated = answer["sockets"], answer["protocols"], answer["more"]
            if type(count) is not int or not isinstance(kinds, dict):
                raise TypeError("not {ids, more, sockets: int, protocols: {}}")
        except (ValueError, KeyError, TypeError) as error:
            logger.warning("an instance's presence answer is unreadable: %s", error)
            complete = False
            continue
        ids.update(found)
        more, sockets = more or bool(truncated), sockets + count
        protocols.update({str(kind): int(n) for kind, n in kinds.items()})
    keys = sorted(ids)
    page = keys[:limit]
    follows = more or len(keys) > limit
    return {
        "listeners": [ids[key] for key in page],
        "sockets": sockets,
        "protocols": {**dict.fromkeys(PROTOCOLS, 0), **protocols},
        "next": page[-1] if follows and page else None,
        "complete": complete,
    }


def merged_online(
    answers: Iterable[bytes], complete: bool, asked: list[ListenerId]
) -> dict[str, Any]:
    """The ids any instance holds, in the order they were asked."""
    held: set[str] = set()
    for data in answers:
        try:
            held.update(id_text(listener_id) for listener_id in orjson.loads(data)["online"])
        except (ValueError, KeyError, TypeError) as error:
            logger.warning("an instance's online answer is unreadable: %s", error)
            complete = False
    online = [listener_id for listener_id in asked if id_text(listener_id) in held]
    return {"online": online, "complete": complete}
