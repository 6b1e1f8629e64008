"""``subscribe`` (``clients.md`` section 11): a protocol-2 socket narrows what it receives to
topic filters. Protocol 1 ignores the event, as Bow has none.

``subscribe({"add": [...], "remove": [...]}, ack)``: the ack receives ``{"filters": [...]}``, the
socket's whole set, sorted, or ``{"error": {"code": 4000, "reason": "bad_request", "text"}}`` and
nothing changed. ``remove`` takes exactly a filter held (removing one not held changes nothing,
as MQTT's UNSUBSCRIBE); a filter in both lists is refused. A socket may subscribe before it
authenticates: the filters apply from its first message on, to a recovery's replay too.

The bounds of every protocol's filters are here too (:func:`refusal`): ``outbound.max_filters``
per connection (each protocol counts its own), ``outbound.max_filters_per_id`` distinct filters
across the connections of one listener id on this instance (anonymous connections, and those not
authenticated yet, count as one id), ``outbound.max_filters_per_instance`` in all.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Any, Final

from ..core import codes
from ..core.topic_index import TopicIndex
from ..core.topics import parse_filter
from . import codec
from .connection import Connection, logger
from .parts import Sockets

KEYS: Final = ("add", "remove")


class _Anonymous:
    """Whom the filters of connections without a listener id are counted for (one owner)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<anonymous>"


ANONYMOUS: Final = _Anonymous()


def owner(connection: Connection) -> Hashable:
    """Whom ``connection``'s filters count for: its listener id, or :data:`ANONYMOUS`."""
    return ANONYMOUS if connection.listener_id is None else connection.listener_id


def refusal(
    outbound: Sockets,
    connection: Connection,
    adding: Collection[str],
    *,
    who: Hashable | None = None,
) -> str | None:
    """Why ``connection`` may not hold ``adding`` too (filters it does not hold): past its
    listener id's distinct filters or the instance's (None: it may). Its filters held so far
    are counted for the id it has now, or for ``who`` (an SSE stream's, before it is held)."""
    settings = outbound.settings
    topics = outbound.topics[connection.outbound.middleware_version]
    who = owner(connection) if who is None else who
    topics.rehome(connection, who)
    new = sum(1 for text in set(adding) if not topics.owns(who, text))
    limit = settings.max_filters_per_id
    if new and topics.owned(who) + new > limit:
        whose = "anonymous connections" if who is ANONYMOUS else "a listener id's connections"
        return f"{whose} hold at most {limit} distinct filters here (outbound.max_filters_per_id)"
    limit = settings.max_filters_per_instance
    held = sum(index.subscriptions for index in outbound.topics.values())
    if adding and held + len(adding) > limit:
        return f"this instance holds at most {limit} filters (outbound.max_filters_per_instance)"
    return None


class BadSubscribe(ValueError):
    """A ``subscribe`` refused as a whole: its text goes to the ack."""


def subscribe(outbound: Sockets, connection: Connection, args: list[Any], ack_id: Any) -> None:
    """Apply one ``subscribe`` event of ``connection``, all of it or nothing, and acknowledge it."""
    if not connection.codec.coded or connection.closing is not None:
        return
    topics = outbound.topics[connection.outbound.middleware_version]
    try:
        add, remove = _request(args)
        _apply(outbound, topics, connection, add, remove)
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
        outbound.writer.write(connection, codec.ack(ack_id, result, proto=2))


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
    outbound: Sockets,
    topics: TopicIndex[Connection],
    connection: Connection,
    add: list[str],
    remove: list[str],
) -> None:
    max_filters = outbound.settings.max_filters
    held = topics.filters_of(connection)
    after = (held - set(remove)) | set(add)
    if len(after) > max_filters:
        raise BadSubscribe(
            f"a socket holds at most {max_filters} filters (outbound.max_filters), "
            f"this would make {len(after)}"
        )
    removed = [text for text in remove if topics.remove(connection, text)]
    adding = [text for text in dict.fromkeys(add) if text not in held]
    why = refusal(outbound, connection, adding)
    if why is not None:
        for text in removed:  # all or nothing: as it was
            topics.add(connection, text, owner=owner(connection))
        raise BadSubscribe(why)
    for text in adding:
        topics.add(connection, text, owner=owner(connection))
