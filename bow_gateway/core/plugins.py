"""The plugin contract: the functions the gateway calls, named, their records, and how a
``"module:attribute"`` reference becomes one.

Each function takes one argument and returns its result or an awaitable of it (a plain or a
coroutine function); raising is a refusal. An inbound's function takes the request's JSON body,
or an :class:`InboundRequest` (path parameters, query, headers, raw body). A middleware may also
*watch* its criteria (:class:`WatchesCriteria`), and any plugin may hold resources that
``Bow.stop()`` closes (:class:`AsyncClosable`).
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

import orjson

from .criteria import ListenerId

if TYPE_CHECKING:
    from aiohttp import web
    from multidict import CIMultiDictProxy, MultiMapping


class CreateMessageFromRequestBody(Protocol):
    """An inbound: a request's JSON body to a message (``name``, ``audience``, ``payload``);
    raising refuses the body (``422``)."""

    def __call__(self, body: Any, /) -> Any | Awaitable[Any]: ...


@dataclass(frozen=True, slots=True)
class InboundRequest:
    """What ``create_message_from_request`` receives: a request already read, detached from its
    connection (a function cannot wait on the socket), for inbounds such as Gobbler's REST API."""

    path: str
    """The request's path, percent-decoded (``/api/message/chat/room1``)."""
    match_info: Mapping[str, str]
    """The path's parameters: ``{"topic": "chat/room1"}`` for ``/api/message/{topic:.+}``."""
    query: MultiMapping[str]
    """The query string's parameters (``query.get("userId")``, ``query.getall("tag", [])``)."""
    headers: CIMultiDictProxy[str]
    """The request's headers, looked up in any case; their names as sent."""
    body: bytes
    """The raw body (empty when there is none), at most ``inbound.max_body_size`` bytes."""
    content_type: str
    """The ``Content-Type`` without parameters, in lower case (``application/octet-stream``
    when absent)."""
    charset: str | None = None
    """The ``Content-Type``'s charset parameter, if any."""

    def text(self) -> str:
        """The body decoded as UTF-8; ``UnicodeDecodeError`` (a ``ValueError``) if it is not."""
        return self.body.decode("utf-8")

    def json(self) -> Any:
        """The body parsed as strict JSON; ``ValueError`` if it is not JSON."""
        return orjson.loads(self.body)


class CreateMessageFromRequest(Protocol):
    """An inbound that needs more than the JSON body: an :class:`InboundRequest` to a message (or
    a list of them); raising refuses the request (``422``)."""

    def __call__(self, request: InboundRequest, /) -> Any | Awaitable[Any]: ...


class CreateListenerDetailsFromToken(Protocol):
    """An outbound: the token a socket authenticates with to listener details (``{"id": ...}``);
    raising refuses the socket (``alert``, then a disconnect)."""

    def __call__(self, token: Any, /) -> Any | Awaitable[Any]: ...


class CreateMessageFromPublish(Protocol):
    """An outbound: a client's publish (Flywheel's ``P {topic} {body}``) to a message (``name``,
    ``audience``, ``payload``); ``listener_details`` is ``None`` for an anonymous connection.
    Raising refuses the publish (the client's errors topic says why)."""

    def __call__(
        self, listener_details: Mapping[str, Any] | None, topic: str, body: str, /
    ) -> Any | Awaitable[Any]: ...


class CreateCriteriaFromListenerDetails(Protocol):
    """A middleware: listener details to criteria; a ``LookupError`` says the listener is unknown,
    anything else raised refuses it."""

    def __call__(self, details: Mapping[str, Any], /) -> Any | Awaitable[Any]: ...


class HealthCheck(Protocol):
    """``bow.health_check``: a ``GET /health`` request to its ``200`` answer (a response, or any
    JSON-serialisable value); raising answers ``503``."""

    def __call__(self, request: web.Request, /) -> Any | Awaitable[Any]: ...


class Enrich(Protocol):
    """An enricher: a message, as the mapping ``{"name", "payload", "audience"}`` (``payload``
    only when it has one), to the message to accept instead (the same mapping changed, or a new
    one; it is checked again); raising refuses the message (``422`` at the inbound)."""

    def __call__(self, message: dict[str, Any], /) -> Any | Awaitable[Any]: ...


EnrichInit: TypeAlias = Callable[[], Any]
"""An enricher's ``init``: called once at ``start()``, with no argument; it may return an
awaitable (a coroutine function), which is awaited."""

PluginFunction: TypeAlias = (
    CreateMessageFromRequestBody
    | CreateMessageFromRequest
    | CreateListenerDetailsFromToken
    | CreateCriteriaFromListenerDetails
    | HealthCheck
    | Enrich
)


@runtime_checkable
class WatchesCriteria(Protocol):
    """A middleware whose criteria change behind the gateway's back (a database, a snapshot).

    Each time ``watch()`` yields a list of listener ids (``None``: all of them), every instance
    recomputes the criteria of the listeners it holds and re-indexes them.
    """

    def watch(self) -> AsyncIterator[list[ListenerId] | None]: ...


@runtime_checkable
class AsyncClosable(Protocol):
    """A plugin holding resources (connections, pools): ``Bow.stop()`` awaits ``aclose()``."""

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class MiddlewarePlugin:
    """A middleware version and its function; ``reference`` and ``table`` say where a
    configuration file named it (``"module:attribute"``, ``"[[middlewares]] #1"``)."""

    version: str
    create_criteria_from_listener_details: CreateCriteriaFromListenerDetails
    reference: str | None = None
    table: str | None = None


@dataclass(frozen=True)
class InboundPlugin:
    """An inbound: its path (aiohttp's syntax: it may hold parameters), how a body or a request
    becomes a message (exactly one of the two functions), the middleware version resolving it."""

    path: str
    create_message_from_request_body: CreateMessageFromRequestBody | None
    middleware_version: str
    reference: str | None = None
    table: str | None = None
    create_message_from_request: CreateMessageFromRequest | None = None

    @property
    def function(self) -> CreateMessageFromRequestBody | CreateMessageFromRequest:
        """Whichever of the two functions it has."""
        function = self.create_message_from_request or self.create_message_from_request_body
        assert function is not None, "an inbound has one of the two functions"
        return function


@dataclass(frozen=True)
class OutboundPlugin:
    """An outbound: its version, how a token becomes listener details, its middleware version."""

    version: str
    create_listener_details_from_token: CreateListenerDetailsFromToken
    middleware_version: str
    reference: str | None = None
    table: str | None = None
    anonymous_criteria: Mapping[str, Any] | None = None
    """Protocol 2: the criteria of a socket that authenticates with token ``null`` (None: off)."""
    create_message_from_publish: CreateMessageFromPublish | None = None
    """What a client's publish becomes (None: clients cannot publish)."""


@dataclass(frozen=True)
class EnricherPlugin:
    """An enricher: the MQTT topic filter its messages' names match, its function, its ``init``."""

    filter: str
    enrich: Enrich
    init: EnrichInit | None = None
    reference: str | None = None
    table: str | None = None


def resolve(reference: str) -> Any:
    """The object a ``"module:attribute"`` reference names (the attribute may be dotted).

    Every failure is a ``ValueError`` quoting the reference; an import's own error is its cause.
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{reference!r} must look like 'module:attribute'")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:  # any failure of the import is the reference's
        raise ValueError(f"cannot import {reference!r}: {type(error).__name__}: {error}") from error
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(
                f"cannot import {reference!r}: {module_name} has no attribute {attribute!r}"
            ) from None
    return target
