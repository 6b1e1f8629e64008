"""Messages and the events that travel on the backplane.

A message is what an inbound accepted: an event ``name``, an optional ``payload`` and an
``audience`` (a list of queries, each a non-empty mapping of predicates), and rarely what
Gobbler's format adds (:class:`Publication`: headers, the publisher's ids). A name is held to
one rule whichever way it comes in (:func:`~.names.name_error`). Events are how messages and
criteria changes cross the backplane: small JSON documents, encoded once where they start.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

import orjson
from marshmallow import EXCLUDE, Schema, ValidationError, fields, validate

from .criteria import Criteria, ListenerId, ScalarField, error_text, is_scalar, typed_key
from .index import Query
from .names import name_error
from .publication import (
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MAX_ID_LENGTH,
    PUBLICATION_KEY_SET,
    Publication,
    read_publication,
)

EMPTY_QUERY_ERROR: Final = "a query needs at least one predicate ({{}} would silently match nobody)"


def _check_name(name: str) -> None:
    why = name_error(name)
    if why is not None:
        raise ValidationError(why)


class _MessageSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    name = fields.String(required=True, validate=_check_name)
    payload = fields.Raw(allow_none=True)
    audience = fields.List(
        fields.Dict(
            keys=fields.String(),
            values=ScalarField(),
            validate=validate.Length(min=1, error=EMPTY_QUERY_ERROR),
        ),
        required=True,
    )


_schema: Final = _MessageSchema()


@dataclass(slots=True)
class Message:
    """An accepted message: the Socket.IO event ``name``, its data, and who it is for.

    Shared by every socket it reaches, so never changed once made; not a frozen dataclass only
    because every instance decodes every message, and a frozen one's ``__init__`` costs three
    times as much (measured: 660 against 200 ns for four fields)."""

    name: str
    audience: list[Query]
    payload: Any = None
    has_payload: bool = field(default=False)
    publication: ClassVar[Publication | None] = None
    """Gobbler's headers and publisher ids: never on a ``Message``, on a :class:`PublishedMessage`
    when the inbound's function gave any."""


@dataclass(slots=True)
class PublishedMessage(Message):
    """A message with Gobbler's fields: a class of its own, so that the others (nearly all)
    neither build nor carry the field (each field costs its ``__init__`` a store)."""

    publication: Publication | None = None  # type: ignore[misc]  # a field here, None above


def validate_message(
    value: Any,
    *,
    max_queries: int = 1_000,
    max_predicates: int = 32,
    max_headers: int = MAX_HEADERS,
    max_header_bytes: int = MAX_HEADER_BYTES,
    max_id_length: int = MAX_ID_LENGTH,
    prefix: str = "",
    client: bool = False,
) -> Message:
    """Check what an inbound's function returned; ``ValueError`` names the field, after
    ``prefix`` (a batch's index: ``"3"`` makes ``3.audience.0: ...``). ``client``: the message
    is a client's publish, whose name :func:`name_error` holds to a client's rule.

    The audience's size is checked first, so that a huge one costs no more than a count; its
    repeated queries are dropped (each would cost a resolution per delivery, for nothing).
    ``headers`` (at most ``max_headers``, ``max_header_bytes`` of names and values in UTF-8) and
    the publisher's ids (at most ``max_id_length`` characters) are looked for only when the
    mapping has keys beyond the message's own, so they cost nothing when absent.
    """
    if not isinstance(value, Mapping):
        where = f"{prefix}: " if prefix else ""
        raise ValueError(f"{where}a message must be a mapping, not {type(value).__name__}")
    name = value.get("name")
    if client and type(name) is str:  # another type: the schema says what is wrong with it
        why = name_error(name, client=True)
        if why is not None:
            raise ValueError(f"{prefix}.name: {why}" if prefix else f"name: {why}")
    _check_size(value.get("audience"), max_queries, max_predicates, prefix)
    message = _plainly_valid(value) or _loaded(value, prefix)
    audience = _distinct(message.audience)
    if len(value) > 2 + message.has_payload and not PUBLICATION_KEY_SET.isdisjoint(value):
        limits = (max_headers, max_header_bytes, max_id_length)
        publication = read_publication(value, prefix, *limits)
        if publication is not None:
            parts = (message.name, audience, message.payload, message.has_payload)
            return PublishedMessage(*parts, publication)
    if len(audience) == len(message.audience):
        return message
    return Message(message.name, audience, message.payload, message.has_payload)


def _loaded(value: Mapping[str, Any], prefix: str, sample: int = 10) -> Message:
    """The schema's verdict, found on the first ``sample`` faulty queries only (marshmallow takes
    ~0.2 s over a thousand queries of 32 predicates); the whole audience if they pass."""
    audience: Any = value.get("audience")
    faulty = (
        [position for position, query in enumerate(audience) if not _plain_query(query)]
        if type(audience) is list
        else []
    )
    if faulty:
        try:
            _schema.load({**value, "audience": [audience[i] for i in faulty[:sample]]})
        except ValidationError as error:
            messages = dict(error.messages)  # type: ignore[arg-type]
            found = messages.get("audience")
            if isinstance(found, Mapping):  # back to the positions in the whole audience
                messages["audience"] = {
                    faulty[k] if isinstance(k, int) else k: v for k, v in found.items()
                }
            extra = f" (in the first {sample} of {len(faulty)} faulty queries)"
            text = error_text(messages, prefix)
            raise ValueError(text + extra * (len(faulty) > sample)) from None
    try:
        loaded = _schema.load(value)
    except ValidationError as error:
        raise ValueError(error_text(error.messages, prefix)) from None
    return Message(
        name=loaded["name"],
        audience=loaded["audience"],
        payload=loaded.get("payload"),
        has_payload="payload" in loaded,
    )


def _check_size(audience: Any, max_queries: int, max_predicates: int, prefix: str) -> None:
    if type(audience) is not list:
        return  # the schema says what is wrong with it
    where = f"{prefix}.audience" if prefix else "audience"
    if len(audience) > max_queries:
        raise ValueError(f"{where}: at most {max_queries} queries, not {len(audience)}")
    for position, query in enumerate(audience):
        # type() first: isinstance against the Mapping ABC costs ~0.2 µs a query
        if (type(query) is dict or isinstance(query, Mapping)) and len(query) > max_predicates:
            raise ValueError(
                f"{where}.{position}: at most {max_predicates} predicates, not {len(query)}"
            )


def _distinct(audience: list[Query]) -> list[Query]:
    """The queries of a valid audience without repeats (JSON equality, in any key order)."""
    if len(audience) < 2:
        return audience
    seen: set[frozenset[tuple[str, Hashable]]] = set()
    distinct = []
    for query in audience:
        key = frozenset((predicate, typed_key(value)) for predicate, value in query.items())
        if key not in seen:
            seen.add(key)
            distinct.append(query)
    return distinct


def _plainly_valid(value: Mapping[str, Any]) -> Message | None:
    """The message, when ``value`` is one as JSON gives it; ``None`` sends it to the schema.

    The inbound's hot path: a fifth of marshmallow's cost. It accepts only what the schema
    accepts (tests/test_message.py checks that against random documents); the schema
    finds the words for everything else.
    """
    name, audience = value.get("name"), value.get("audience")
    if type(name) is not str or name_error(name) is not None or type(audience) is not list:
        return None
    for query in audience:
        if not _plain_query(query):
            return None
    has_payload = "payload" in value
    return Message(name, audience, value["payload"] if has_payload else None, has_payload)


def _plain_query(query: Any) -> bool:
    """A query as JSON gives it: a non-empty dict of string keys to scalars."""
    if type(query) is not dict or not query:
        return False
    return all(type(key) is str and is_scalar(predicate) for key, predicate in query.items())


def event_bytes(message: Message) -> int:
    """The size the event takes for a socket: the compact JSON of ``[name, payload]`` (``[name]``
    without payload), UTF-8; ``ValueError`` for a payload JSON cannot hold."""
    return len(dumps([message.name, message.payload] if message.has_payload else [message.name]))


def parse_json(body: bytes) -> Any:
    """Parse a request body as strict JSON (``NaN``, ``Infinity`` and ``1e400`` are refused).

    orjson: ~8x faster than the standard library; integers past 64 bits become floats.
    """
    return orjson.loads(body)


def dumps(value: Any) -> bytes:
    """Compact JSON, UTF-8; ``ValueError`` for what JSON cannot hold (a set, an int past 64 bits).

    NaN and the infinities (which only a user's function can make: bodies refuse them) become
    ``null``, as JavaScript's ``JSON.stringify`` and so Bow make them.
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError as error:  # orjson.JSONEncodeError
        raise ValueError(f"not JSON: {error}") from None


# -- backplane events -----------------------------------------------------------------------


@dataclass(slots=True)
class MessageEvent:
    """A message to deliver, with the middleware version whose index resolves its audience (not
    frozen, for the reason :class:`Message` gives; never changed once made)."""

    middleware_version: str
    message: Message
    accepted_at: float = 0.0  # time.time() when the inbound accepted it, for latency metrics
    sequence: int | None = None  # its sequence in its topic's history, when kept there ("q")
    id: str = ""  # the message id (section 16: :mod:`.message_ids`), the same on every instance
    receipt: int = 0  # seconds its receipt stays open (section 17; 0: it asked for none)
    fallback: bool = False  # Bow-Fallback: message.undelivered for those who missed it (19)


@dataclass(slots=True)
class CriteriaEvent:
    """A listener authenticated somewhere with these criteria: every instance holding it updates."""

    middleware_version: str
    listener_id: ListenerId
    criteria: Criteria
    basis: str | None = None  # the last position seen when they were read: older control loses


@dataclass(frozen=True, slots=True)
class SetCriteriaEvent:
    """``POST /_bow/criteria``: these ids' criteria, replaced on every instance and version."""

    changes: list[tuple[ListenerId, Criteria]]


@dataclass(frozen=True, slots=True)
class KickEvent:
    """``POST /_bow/disconnect``: every socket of these ids gets 4005, then a disconnect."""

    ids: list[ListenerId]
    reason: str
    reconnect: str


@dataclass(frozen=True, slots=True)
class CountEvent:
    """``POST /_bow/count``: every instance answers how many of its sockets match now."""

    request_id: str
    audience: list[Query]


def id_text(listener_id: ListenerId) -> str:
    """A listener id's JSON text: what presence orders ids by, and what its cursors name."""
    return dumps(listener_id).decode()


@dataclass(frozen=True, slots=True)
class PresenceEvent:
    """``POST /_bow/presence`` (``audience``: the listeners matching it, ``limit`` of them after
    ``after``, the JSON text of an id) or ``/_bow/online`` (``ids``: those held): every instance
    answers what it holds now (contract section 18)."""

    request_id: str
    audience: list[Query] | None = None
    after: str | None = None
    limit: int = 1_000
    ids: list[ListenerId] | None = None


Event = MessageEvent | CriteriaEvent | SetCriteriaEvent | KickEvent | CountEvent | PresenceEvent


def encode_event(event: Event) -> bytes:
    if isinstance(event, MessageEvent):
        message = event.message
        document: dict[str, Any] = {
            "m": event.middleware_version,
            "n": message.name,
            "a": message.audience,
            "t": event.accepted_at,
        }
        if event.id:
            document["i"] = event.id
        if event.receipt:
            document["r"] = event.receipt
            if event.fallback:
                document["f"] = 1
        if message.has_payload:
            document["p"] = message.payload
        if message.publication is not None:
            document["g"] = list(message.publication)  # headers, user, application, message ids
        return dumps(document)
    if isinstance(event, CriteriaEvent):
        document = {"c": event.middleware_version, "i": event.listener_id, "k": event.criteria}
        if event.basis is not None:
            document["b"] = event.basis
        return dumps(document)
    if isinstance(event, SetCriteriaEvent):
        return dumps({"s": [[listener_id, criteria] for listener_id, criteria in event.changes]})
    if isinstance(event, KickEvent):
        return dumps({"x": event.ids, "r": event.reason, "a": event.reconnect})
    if isinstance(event, PresenceEvent):
        if event.ids is not None:
            return dumps({"w": event.request_id, "o": event.ids})
        return dumps(
            {"w": event.request_id, "a": event.audience, "f": event.after, "l": event.limit}
        )
    return dumps({"q": event.request_id, "a": event.audience})


def decode_event(data: bytes) -> Event:
    """Read an event written by :func:`encode_event` (on this instance or another one)."""
    document = orjson.loads(data)
    if "m" in document:
        gobbler = document.get("g")
        if gobbler is None:
            message = Message(document["n"], document["a"], document.get("p"), "p" in document)
        else:
            parts = (document["n"], document["a"], document.get("p"), "p" in document)
            message = PublishedMessage(*parts, Publication(*gobbler))
        event = MessageEvent(
            document["m"], message, document.get("t", 0.0), document.get("q"), document.get("i", "")
        )
        if "r" in document:
            event.receipt, event.fallback = document["r"], "f" in document
        return event
    if "c" in document:
        return CriteriaEvent(document["c"], document["i"], document["k"], document.get("b"))
    if "s" in document:
        return SetCriteriaEvent([(entry[0], entry[1]) for entry in document["s"]])
    if "x" in document:
        return KickEvent(document["x"], document["r"], document["a"])
    if "w" in document:
        if "o" in document:
            return PresenceEvent(document["w"], ids=document["o"])
        return PresenceEvent(document["w"], document["a"], document["f"], document["l"])
    return CountEvent(document["q"], document["a"])


def count_answer(result: tuple[int, Collection[ListenerId]], count_max_ids: int) -> bytes:
    """This instance's answer to a count, from ``outbound.delivery.count(audience)``:
    ``{"sockets": n, "ids": [...]}``, ids ``null`` when there are over ``count_max_ids``."""
    sockets, ids = result
    return dumps({"sockets": sockets, "ids": list(ids) if len(ids) <= count_max_ids else None})
