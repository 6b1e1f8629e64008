"""The HTTP inbound: ``POST {path}`` turns a JSON body into a message, behind Basic Auth
(:mod:`.inbound_auth`).

Statuses, as the contract says: 401 without valid credentials (whatever the path, so that no one
learns which paths exist), then 404, 405, 413 (the body, a batch over ``inbound.max_batch``, or an
event over ``outbound.max_event_bytes``), 422, 503 (with ``Retry-After``), and 204 with
``Bow-Position`` once the messages are on the backplane; 408 for a body that does not arrive in
time, 400 for one that does not decode.

The inbound's function takes the JSON body, or (``create_message_from_request``) the whole request
read into an :class:`~bow_gateway.core.plugins.InboundRequest`; it returns one message, or a list
of them (a batch, contract section 15):
every one is checked, then every one enriched (:mod:`bow_gateway.core.enrichers`), then all are
published in one trip to the backplane, in order, or none is. The ``204``'s ``Bow-Position`` is the
last one's; an empty list is answered ``204`` without it (nothing was positioned).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from types import MappingProxyType
from typing import Any, Final, NamedTuple

from aiohttp import hdrs, web

from ..backplanes import AlreadyAccepted, BackplaneUnavailable, Claim
from ..core.enrichers import EnricherRefused, EnricherTimeout
from ..core.message import Message, MessageEvent, event_bytes, parse_json, validate_message
from ..core.message_ids import new_ids
from ..core.plugins import HealthCheck, InboundPlugin, InboundRequest
from ..runtime.http_server import request_timeout
from ..runtime.metrics import Metrics
from ..runtime.userfn import call_user_function, describe
from .accepted import Accepted, unavailable, unprocessable
from .idempotency import KEY_HEADER, Keys, checked_key, repeated
from .receipt_headers import FALLBACK_HEADER, NOTHING, RECEIPT_HEADER, Asked, checked_receipt

logger = logging.getLogger("bow_gateway.inbound")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PublishMany = Callable[[list[MessageEvent], Claim | None], Awaitable[list[str]]]
"""Events to the backplane in one trip, in order, with an idempotency claim or None; their
positions."""
Enrich = Callable[[list[Message]], Awaitable[list[Message]]]
AcceptJson = Callable[[bytes, str | None], Awaitable[Accepted | None]]
"""A whole JSON body to the backplane: what was accepted (None: no message), or the refusal as
a ``web.HTTPException`` (logged and counted already)."""


class InboundHandler(NamedTuple):
    """An inbound's aiohttp handler, and (for an inbound taking the JSON body) what it does with
    a body that arrived whole, for the fast path (:mod:`.http_fast_path`)."""

    handle: Handler
    accept_json: AcceptJson | None


def message_handler(
    inbound: InboundPlugin,
    publish: PublishMany,
    metrics: Metrics,
    *,
    enrich: Enrich | None = None,
    timeout: float = 5.0,
    max_queries: int = 1_000,
    max_predicates: int = 32,
    max_event_bytes: int = 262_144,
    max_batch: int = 1_000,
    idempotency_window: float = 600.0,
    check: Callable[[web.Request], None] | None = None,
) -> InboundHandler:
    """The aiohttp handler of one inbound path; ``timeout`` bounds the body's arrival, the
    message function, then the enrichers. ``publish`` returns the events' positions (the last
    is the ``Bow-Position``); ``enrich`` passes the messages through the enrichers; ``check``
    refuses a request first (the credentials), before it counts as refused; an
    ``Idempotency-Key`` holds for ``idempotency_window`` seconds (:mod:`.idempotency`)."""
    limits: dict[str, Any] = {"max_queries": max_queries, "max_predicates": max_predicates}
    endpoint = _Inbound(inbound, publish, metrics, enrich, timeout, limits, max_event_bytes)
    endpoint.max_batch, endpoint.check = max_batch, check
    endpoint.keys = Keys(inbound.path, window=idempotency_window)
    takes_json = inbound.create_message_from_request is None
    return InboundHandler(endpoint.handle, endpoint.accept_json if takes_json else None)


class _Inbound:
    """One inbound path's requests: read, the message function, checks, enrichers, ids, the
    backplane; each refusal logged and counted."""

    max_batch = 1_000
    check: Callable[[web.Request], None] | None = None
    keys: Keys

    def __init__(
        self,
        inbound: InboundPlugin,
        publish: PublishMany,
        metrics: Metrics,
        enrich: Enrich | None,
        timeout: float,
        limits: dict[str, Any],
        max_event_bytes: int,
    ) -> None:
        self.inbound, self.publish, self.metrics = inbound, publish, metrics
        self.enrich, self.timeout, self.limits = enrich, timeout, limits
        self.max_event_bytes = max_event_bytes
        self.create_message = inbound.function
        self.takes_request = inbound.create_message_from_request is not None
        self.accepted = metrics.messages_accepted.labels(inbound.path)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.check is not None:
            self.check(request)
        try:
            headers = request.headers
            key = checked_key(headers.get(KEY_HEADER))
            asked = checked_receipt(headers.get(RECEIPT_HEADER), headers.get(FALLBACK_HEADER))
            if key is None:
                done = await self.published((await self.arrived(request))[0], None, asked)
            else:
                self.keys.start(key)
                try:
                    argument, body = await self.arrived(request)
                    done = await self.published(argument, (key, body), asked)
                finally:
                    self.keys.end(key)
        except web.HTTPException as error:
            log_refusal(self.metrics, self.inbound.path, request.method, request.path, error)
            raise
        if done is None:
            return web.Response(status=204)
        return web.Response(status=204, headers=done.headers())

    async def accept_json(self, body: bytes, key: str | None) -> Accepted | None:
        """A whole JSON body the fast path read (:data:`AcceptJson`)."""
        try:
            if key is None:
                return await self.published(json_body(body), None)
            checked_key(key)
            self.keys.start(key)
            try:
                return await self.published(json_body(body), (key, body))
            finally:
                self.keys.end(key)
        except web.HTTPException as error:
            log_refusal(self.metrics, self.inbound.path, hdrs.METH_POST, self.inbound.path, error)
            raise

    async def arrived(self, request: web.Request) -> tuple[Any, bytes]:
        """What the function takes, and the body as it arrived (an idempotency key's)."""
        if self.takes_request:
            whole = await read_request(request, self.timeout)
            return whole, whole.body
        body = await read_json_bytes(request, self.timeout)
        return json_body(body), body

    async def published(
        self, argument: Any, keyed: tuple[str, bytes] | None, asked: Asked = NOTHING
    ) -> Accepted | None:
        """The message function on ``argument``, the checks, the enrichers, ids, one trip to the
        backplane (with ``keyed``'s claim): what was accepted (None: no message). ``asked``:
        the receipt every message of the request asked for."""
        create_message, timeout = self.create_message, self.timeout
        try:
            raw = await call_user_function(create_message, argument, timeout)
        except TimeoutError:
            late = f"{describe(create_message)} did not answer within {timeout:g} s"
            raise unavailable(1) from TimeoutError(late)
        except Exception as error:  # noqa: BLE001 - the user's function refused the body
            what = "request" if self.takes_request else "body"
            raise unprocessable(f"the {what} was refused: {error}") from None
        batch = isinstance(raw, list)
        messages = checked_messages(raw, batch, self.max_batch, self.limits)
        if self.enrich is not None:
            messages = await enriched(self.enrich, messages, batch)
        for index, message in enumerate(messages):
            check_size(message, f"{index}: " if batch else "", self.max_event_bytes)
        if not messages:
            return None
        ids = new_ids(len(messages))
        claim = None if keyed is None else self.keys.claim(keyed[0], keyed[1], ids, batch)
        events = message_events(self.inbound.middleware_version, messages, ids, asked)
        try:
            positions = await self.publish(events, claim)
        except AlreadyAccepted as taken:
            assert claim is not None
            return repeated(taken, claim)
        except BackplaneUnavailable as error:
            raise unavailable(error.retry_after) from error
        self.accepted.inc(len(messages))
        return Accepted(positions[-1], ids, batch)


def message_events(
    middleware_version: str, messages: list[Message], ids: list[str], asked: Asked = NOTHING
) -> list[MessageEvent]:
    """Messages checked and enriched, with their ids (and the receipt ``asked``), as the
    backplane carries them (a plain function: one coroutine less a request than an ``async``
    one)."""
    now = time.time()
    window, fallback = asked
    return [
        MessageEvent(middleware_version, message, now, None, message_id, window, fallback)
        for message, message_id in zip(messages, ids, strict=True)
    ]


def log_refusal(
    metrics: Metrics, inbound: str, method: str, path: str, error: web.HTTPException
) -> None:
    """Count a request of inbound path ``inbound`` refused, and log why."""
    metrics.messages_refused.labels(inbound, str(error.status)).inc()
    level = logging.WARNING if error.status >= 500 else logging.INFO
    # The cause, when there is one, is for the log only (a Redis address, a plugin).
    cause = f" ({error.__cause__})" if error.__cause__ is not None else ""
    logger.log(level, "refused %s %s: %s%s", method, path, error.text, cause)


def checked_messages(
    raw: Any, batch: bool, max_batch: int, limits: dict[str, Any]
) -> list[Message]:
    """What a message function returned (one message, or a ``batch``), checked: ``413`` over
    ``max_batch`` messages, ``422`` naming the first faulty one."""
    if batch and len(raw) > max_batch:
        raise web.HTTPRequestEntityTooLarge(
            max_batch,
            len(raw),
            text=f"413: the inbound's function returned {len(raw)} messages, over "
            f"inbound.max_batch ({max_batch})",
        )
    try:
        if not batch:
            return [validate_message(raw, prefix="", **limits)]
        return [
            validate_message(value, prefix=str(index), **limits) for index, value in enumerate(raw)
        ]
    except ValueError as error:  # the first faulty message's
        raise unprocessable(f"invalid message: {error}") from None


async def enriched(enrich: Enrich, messages: list[Message], batch: bool) -> list[Message]:
    """The messages through the enrichers: ``422`` naming the enricher that refused one (and,
    in a batch, its index), ``503`` for one that did not answer in time."""
    try:
        return await enrich(messages)
    except EnricherRefused as error:
        where = f"{error.index}: " if batch else ""
        raise unprocessable(f"{where}{error}") from None
    except EnricherTimeout as error:
        raise unavailable(1) from error


def check_size(message: Message, where: str, max_event_bytes: int) -> None:
    """``413`` for an event over ``max_event_bytes``, ``422`` for a payload JSON cannot hold."""
    try:
        size = event_bytes(message)
    except ValueError as error:  # the user's function made a payload JSON cannot hold
        raise unprocessable(f"invalid message: {where}the payload is {error}") from None
    if size > max_event_bytes:
        raise web.HTTPRequestEntityTooLarge(
            max_event_bytes,
            size,
            text=f"413: {where}the event (the compact JSON of [name, payload]) is {size} bytes, "
            f"over outbound.max_event_bytes ({max_event_bytes})",
        )


NO_BODY: Final = "the request has no body: send a JSON message"


async def read_json(request: web.Request, timeout: float) -> Any:
    """The request's JSON body, within ``timeout`` s: 422 without one, sent as another type or
    not JSON; 408 late; 400 undecodable; 413 over the app's ``client_max_size``."""
    return json_body(await read_json_bytes(request, timeout))


async def read_json_bytes(request: web.Request, timeout: float) -> bytes:
    """:func:`read_json`'s body as it arrived (decoded), not parsed yet."""
    if not request.body_exists:
        raise unprocessable(NO_BODY)
    _check_json_content_type(request)
    return await _read(request, timeout)


def json_body(body: bytes) -> Any:
    """The JSON value of a body; 422 for an empty one or one that is not JSON."""
    if not body.strip():
        raise unprocessable(NO_BODY)
    try:
        return parse_json(body)
    except ValueError as error:
        raise unprocessable(f"the body is not JSON: {error}") from None


async def read_request(request: web.Request, timeout: float) -> InboundRequest:
    """The request as ``create_message_from_request`` takes it, its body read as :func:`read_json`
    reads one (any type, maybe empty), detached from the connection; 422 for a browser's
    request from another site."""
    body = await _read(request, timeout) if request.body_exists else b""
    _check_not_cross_site(request)
    return InboundRequest(
        path=request.path,
        match_info=MappingProxyType(dict(request.match_info)),
        query=request.query,
        headers=request.headers,
        body=body,
        content_type=request.content_type,
        charset=request.charset,
    )


def _check_not_cross_site(request: web.Request) -> None:
    """Refuse what a browser sent from another site's page: an inbound taking any type of body
    takes forms, which any site can make a browser post with its cached Basic credentials
    (CSRF; the JSON inbounds refuse them by type). Backends send neither header."""
    site = request.headers.get("Sec-Fetch-Site")
    origin = request.headers.get(hdrs.ORIGIN)
    if site is not None:
        cross, header = site not in ("same-origin", "none"), f"Sec-Fetch-Site: {site}"
    else:
        cross = origin is not None and origin.partition("://")[2] != request.host
        header = f"Origin: {origin}"
    if cross:
        raise unprocessable(
            f"a browser sent this request from a page of another site ({header}): refused, as "
            "it may be a cross-site request forgery"
        )


def _check_json_content_type(request: web.Request) -> None:
    """Refuse a body not sent as JSON, as Bow does: an HTML form, which any site can make a
    browser post, cannot send ``application/json``, so cached Basic credentials cannot be
    abused to push (CSRF)."""
    raw = request.headers.get(hdrs.CONTENT_TYPE)
    if raw is None:
        raise unprocessable("the request has no Content-Type: send the body as application/json")
    if raw == "application/json":  # what nearly every client sends: nothing to parse
        return
    declared = request.content_type  # lower case, without parameters such as charset
    if declared != "application/json" and not declared.endswith("+json"):
        raise unprocessable(
            f"the body must be sent as application/json (or */*+json), not {declared!r}"
        )


async def _read(request: web.Request, timeout: float) -> bytes:
    content = request.content
    try:
        if content.is_eof():  # all of it arrived (and decoded) with the headers: no timer to set
            body = content.read_nowait()  # what request.read() returns, without its loop
            if len(body) > request.client_max_size > 0:  # as request.read() refuses it
                raise web.HTTPRequestEntityTooLarge(request.client_max_size)
            return body
        async with asyncio.timeout(timeout):
            return await request.read()
    except TimeoutError:
        raise request_timeout(timeout) from None
    except web.RequestPayloadError:  # a body that does not decode (Content-Encoding: gzip...)
        raise web.HTTPBadRequest(
            text="400: the body could not be read: it does not match its Content-Encoding "
            "or Transfer-Encoding"
        ) from None
    except ConnectionError:  # the client left mid-body: a refusal, not the gateway's error
        raise web.HTTPBadRequest(
            text="400: the connection closed before the body arrived"
        ) from None


def health_handler(
    is_ready: Callable[[], bool],
    decorator: HealthCheck | None,
    *,
    timeout: float = 5.0,
) -> Handler:
    """``GET /health``: 200, empty or made by ``decorator``; 503 while the instance cannot serve."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if not is_ready():
            return web.Response(status=503, text="503: the backplane is not reachable")
        if decorator is None:
            return web.Response(status=200)
        try:
            result = await call_user_function(decorator, request, timeout)
        except Exception as error:  # noqa: BLE001 - a failing health check means unhealthy
            # The error (a database address...) goes to the log, not to whoever asked.
            logger.warning("the health check raised: %s", error)
            return web.Response(status=503, text="503: the health check failed")
        if isinstance(result, web.StreamResponse):
            return result
        return web.json_response(result)

    return handle
