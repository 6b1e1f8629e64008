"""Gobbler's REST publish (``clients.md`` section 14): ``POST /api/message/{topic}`` publishes the
raw body as the message ``/{topic}``, with Gobbler's headers and publisher ids.

Register :class:`GobblerInbound` as an inbound's ``create_message_from_request``, on a path with
a ``topic`` parameter::

    bow.inbound(
        path="/api/message/{topic:.+}",
        create_message_from_request=GobblerInbound(audience=[{"role": "member"}]),
        middleware_version="v1",
    )

Then ``curl -u pusher:secret -H 'X-Gobbler-Key: Value' --data Hello
'http://localhost:8080/api/message/foo?userId=marvin&messageId=42'`` sends the message ``/foo``,
payload ``"Hello"``, headers ``{"Key": "Value"}``, user id ``marvin`` and message id ``42``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from bow_gateway.core.message import validate_message
from bow_gateway.core.plugins import InboundRequest

HEADER_PREFIX: Final = "x-gobbler-"
"""Request headers whose names start with it (in any case) become the message's headers."""
QUERY_IDS: Final = (("user_id", "userId"), ("message_id", "messageId"))
"""The message's publisher ids and the query parameters Gobbler reads them from."""


class GobblerInbound:
    """``create_message_from_request`` for Gobbler's ``POST /api/message/{topic}``: the body,
    UTF-8 text, is the payload of the message ``/{topic}`` to ``audience``.

    The ``X-Gobbler-*`` request headers become the message's headers, the prefix removed and the
    rest of the name kept as sent (``X-Gobbler-Key`` is ``Key``; a repeated one keeps its first
    value, as Gobbler does); the query's ``userId`` and ``messageId`` become the publisher's user
    id and message id. ``parameter`` names the path's parameter holding the topic.
    """

    def __init__(self, *, audience: Sequence[Mapping[str, Any]], parameter: str = "topic") -> None:
        if isinstance(audience, str | bytes) or not isinstance(audience, Sequence):
            raise ValueError(f"audience must be a list of queries, not {type(audience).__name__}")
        try:
            validate_message({"name": "/audience", "audience": list(audience)})
        except ValueError as error:
            raise ValueError(str(error)) from None  # it names audience and the query
        self.audience = [dict(query) for query in audience]
        self.parameter = parameter

    def __call__(self, request: InboundRequest) -> dict[str, Any]:
        topic = request.match_info.get(self.parameter)
        if not topic:
            raise ValueError(
                f"the inbound's path has no {{{self.parameter}}} parameter: register "
                f"GobblerInbound on a path such as /api/message/{{{self.parameter}:.+}}"
            )
        try:
            text = request.text()
        except UnicodeDecodeError as error:
            raise ValueError(f"the body is not UTF-8 text ({error})") from None
        message: dict[str, Any] = {
            "name": f"/{topic}",
            "payload": text,
            # a copy each time: an enricher may change a message's audience in place
            "audience": [dict(query) for query in self.audience],
        }
        headers: dict[str, str] = {}
        for name, value in request.headers.items():
            if name[: len(HEADER_PREFIX)].lower() == HEADER_PREFIX:
                headers.setdefault(name[len(HEADER_PREFIX) :], value)
        if headers:
            message["headers"] = headers
        for key, parameter in QUERY_IDS:
            given = request.query.get(parameter)
            if given:
                message[key] = given
        return message

    def __repr__(self) -> str:
        return f"GobblerInbound(audience={self.audience!r})"
