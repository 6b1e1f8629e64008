"""``subscribe`` (``clients.md`` section 11): a protocol-2 socket narrows what it receives to
topic filters. Protocol 1 ignores the event, as Bow has none.

``subscribe({"add": [...], "remove": [...]}, ack)``: the ack receives ``{"filters": [...]}``, the
socket's whole set, sorted, or ``{"error": {"code": 4000, "reason": "bad_request", "text"}}`` and
nothing changed. ``remove`` takes exactly a filter held (removing one not held changes nothing,
as MQTT's UNSUBSCRIBE); a filter in both lists is refused. A socket may subscribe before it
authenticates: the filters apply from its first message on, to a recovery's replay too.
"""

from __future__ import annotations

from typing import Any, Final

from .. import codes
from ..topics import TopicIndex, parse_filter
from . import codec
from .connection import Connection, logger
from .parts import Sockets

KEYS: Final = ("add", "remove")


class BadSubscribe(ValueError):
    """A ``subscribe`` refused as a whole: its text goes to the ack."""


def subscribe(outbound: Sockets, connection: Connection, args: list[Any], ack_id: Any) -> None:
    """Apply one ``subscribe`` event of ``connection``, all of it or nothing, and acknowledge it."""
    if connection.proto == 1 or connection.closing is not None:
        return
    topics = outbound.topics[connection.outbound.middleware_version]
    try:
        add, remove = _request(args)
        _apply(topics, connection, add, remove, outbound.settings.max_filters)
    except BadSubscribe as error:
        logger.info("socket %s: subscribe refused: %s", connection.sid, error)
        code = codes.BAD_REQUEST
        result: dict[str, Any] = {
            "error": {"code": code.code, "reason": code.reason, "text": str(error)}
        }
    else:
        result = {"filters": sorted(topics.filters_of(connection))}
    outbound.metrics.subscribes.labels("error" if "error" in result else "ok").inc()
    if ack_id is not None:
        outbound.writer.write(connection, codec.ack(ack_id, result, proto=connection.proto))


def _request(args: list[Any]) -> tuple[list[str], list[str]]:
    """The filters to add and to remove, each checked, or :class:`BadSubscribe`."""
    if len(args) != 1 or not isinstance(args[0], dict):
        raise BadSubscribe(
            'subscribe takes one argument, {"add": [...], "remove": [...]}, and an ack'
        )
    request = args[0]
    unknown = sorted(str(key)[:32] for key in request if key not in KEYS)
    if unknown:
        raise BadSubscribe(f"unknown key {unknown[0]!r}: subscribe takes add and remove")
    lists: list[list[str]] = []
    for key in KEYS:
        filters = request.get(key, [])
        if not isinstance(filters, list):
            raise BadSubscribe(f"{key} must be a list of filters")
        for position, text in enumerate(filters):
            try:
                parse_filter(text)
            except ValueError as error:
                raise BadSubscribe(f"{key}.{position}: {error}") from None
        lists.append(filters)
    add, remove = lists
    both = set(add) & set(remove)
    if both:
        raise BadSubscribe(f"{min(both)!r} is both added and removed")
    return add, remove


def _apply(
    topics: TopicIndex[Connection],
    connection: Connection,
    add: list[str],
    remove: list[str],
    max_filters: int,
) -> None:
    held = topics.filters_of(connection)
    after = (held - set(remove)) | set(add)
    if len(after) > max_filters:
        raise BadSubscribe(
            f"a socket holds at most {max_filters} filters (outbound.max_filters), "
            f"this would make {len(after)}"
        )
    for text in remove:
        topics.remove(connection, text)
    for text in add:
        topics.add(connection, text)
