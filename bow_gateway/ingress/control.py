"""The backend control endpoints (contract section 9), and the same as ``Bow``'s coroutines.

``POST {api.prefix}/criteria`` replaces the criteria of every socket of some ids, ``/disconnect``
kicks them, ``/count`` asks every instance how many sockets match an audience now. Changes travel
the backplane as events, through the messages' own publish path, so they keep their order with
messages: whatever is accepted after the ``204`` is matched against the new state everywhere.
"""

from __future__ import annotations

import logging
import math
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import Any, Final

import orjson
from aiohttp import hdrs, web
from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from ..backplanes import Backplane, BackplaneUnavailable
from ..core.criteria import (
    ID_KEY,
    Criteria,
    CriterionField,
    ListenerId,
    ListenerIdField,
    error_text,
    is_listener_id,
    typed_key,
)
from ..core.index import Query
from ..core.message import (
    CountEvent,
    Event,
    KickEvent,
    PresenceEvent,
    SetCriteriaEvent,
    dumps,
    validate_message,
)
from ..core.receipts import merged_receipt
from ..runtime.audience_index import AudienceIndex
from ..runtime.config import Config
from ..runtime.ratelimit import TokenBucket
from .accepted import POSITION_HEADER, unavailable, unprocessable
from .inbound import read_json
from .presence import check_online, check_presence, merged_online, merged_presence
from .reach import NO_INDEX, WholeBase

logger = logging.getLogger("bow_gateway.control")

ADVICE: Final = ("now", "backoff", "new_token", "never")
"""What a kicked client is told to do (section 10's ``reconnect``)."""
MAX_REASON: Final = 256
"""Characters of a kick's reason text."""

MESSAGE_ID: Final = re.compile(r"[0-9A-Za-z_-]{1,64}")
"""What a message id may look like (:mod:`~bow_gateway.core.message_ids` makes them)."""

Publish = Callable[[Event], Awaitable[str]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _ChangeSchema(Schema):
    id = ListenerIdField(required=True)
    criteria = fields.Dict(keys=fields.String(), values=CriterionField(), required=True)

    @validates_schema
    def _id_kept(self, data: Mapping[str, Any], **kwargs: Any) -> None:
        if ID_KEY in data["criteria"] and not _same_id(data["criteria"][ID_KEY], data["id"]):
            message = "must be the id, or absent: the gateway keeps __id"
            raise ValidationError({ID_KEY: [message]}, field_name="criteria")


class _DisconnectSchema(Schema):
    ids = fields.List(ListenerIdField(), required=True)
    reason = fields.String(
        load_default="",
        validate=validate.Length(max=MAX_REASON, error="at most {max} characters"),
    )
    reconnect = fields.String(
        load_default="new_token",
        validate=validate.OneOf(ADVICE, error="must be one of now, backoff, new_token, never"),
    )


_changes_schema: Final = _ChangeSchema(many=True)
_disconnect_schema: Final = _DisconnectSchema()


def _same_id(value: Any, listener_id: ListenerId) -> bool:
    return is_listener_id(value) and typed_key(value) == typed_key(listener_id)


def check_changes(body: Any, *, max_batch: int = 1_000) -> list[tuple[ListenerId, Criteria]]:
    """``{"id", "criteria"}`` or a list of up to ``max_batch`` of them, checked as a whole;
    ``ValueError`` names each fault by list index and field. ``__id`` is set to the id."""
    entries = [body] if isinstance(body, Mapping) else body
    if not isinstance(entries, list):
        raise ValueError('the body must be {"id": ..., "criteria": {...}} or a list of those')
    if len(entries) > max_batch:
        raise ValueError(f"at most {max_batch} entries (api.max_batch), not {len(entries)}")
    try:
        loaded = _changes_schema.load(entries)
    except ValidationError as error:
        messages = error.messages
        if isinstance(body, Mapping) and isinstance(messages, Mapping):
            messages = messages.get(0, messages)  # one object: no index to name
        raise ValueError(error_text(messages)) from None
    return [(entry["id"], {**entry["criteria"], ID_KEY: entry["id"]}) for entry in loaded]


def check_kick(body: Any, *, max_batch: int = 1_000) -> KickEvent:
    """``{"ids": [...], "reason"?, "reconnect"?}``; ``ValueError`` names the field and index."""
    if not isinstance(body, Mapping):
        raise ValueError('the body must be {"ids": [...], "reason": "...", "reconnect": "..."}')
    ids = body.get("ids")
    if isinstance(ids, list) and len(ids) > max_batch:
        raise ValueError(f"ids: at most {max_batch} (api.max_batch), not {len(ids)}")
    try:
        loaded = _disconnect_schema.load(body)
    except ValidationError as error:
        raise ValueError(error_text(error.messages)) from None
    return KickEvent(loaded["ids"], loaded["reason"], loaded["reconnect"])


def check_count(body: Any, *, max_queries: int = 1_000, max_predicates: int = 32) -> list[Query]:
    """``{"audience": [...]}``, the audience checked as a message's."""
    if not isinstance(body, Mapping):
        raise ValueError('the body must be {"audience": [...]}')
    unknown = sorted(str(key)[:60] for key in body if key != "audience")
    if unknown:
        raise ValueError(f"{unknown[0]}: Unknown field.")
    if "audience" not in body:
        raise ValueError("audience: Missing data for required field.")
    message = {"name": "count", "audience": body["audience"]}
    return validate_message(
        message, max_queries=max_queries, max_predicates=max_predicates
    ).audience


def check_inbound_paths(paths: Iterable[str], prefix: str) -> None:
    """``ValueError`` for an inbound path under the control endpoints' ``prefix``."""
    for path in paths:
        if path == prefix or path.startswith(prefix + "/"):
            raise ValueError(
                f"inbound path {path!r} is under api.prefix {prefix!r}, the gateway's own endpoints"
            )


def summed(answers: Iterable[bytes], complete: bool, count_max_ids: int) -> dict[str, Any]:
    """The instances' answers as ``{"sockets", "listeners", "complete"}``; listeners (distinct
    ids) is ``None`` over ``count_max_ids``; an unreadable answer makes it incomplete."""
    sockets = 0
    ids: set[ListenerId] | None = set()
    for data in answers:
        try:
            answer = orjson.loads(data)
            count, found = answer["sockets"], answer["ids"]
            if type(count) is not int or not (found is None or isinstance(found, list)):
                raise TypeError("not {sockets: int, ids: list | null}")
            ids_found = None if found is None else set(found)
        except (ValueError, KeyError, TypeError) as error:
            logger.warning("an instance's count answer is unreadable: %s", error)
            complete = False
            continue
        sockets += count
        ids = None if ids is None or ids_found is None else ids | ids_found
        if ids is not None and len(ids) > count_max_ids:
            ids = None
    return {
        "sockets": sockets,
        "listeners": None if ids is None else len(ids),
        "complete": complete,
    }


class Control:
    """The control operations of one instance, for its HTTP endpoints and ``Bow``'s methods."""

    def __init__(
        self,
        config: Config,
        publish: Publish,
        backplane: Backplane,
        index: AudienceIndex | None = None,
    ) -> None:
        self._config = config
        self._publish = publish
        self._backplane = backplane
        self.whole_base = WholeBase(index, self._count, max_ids=config.receipts_max_ids)
        rate = config.max_counts_per_second
        self._counts = TokenBucket(rate, max(1.0, rate))
        self._retry_after = max(1, math.ceil(1 / rate))

    async def set_criteria(self, changes: Any) -> str:
        """Replace the criteria of every socket of each id; the event's position ("" for none)."""
        checked = check_changes(changes, max_batch=self._config.api_max_batch)
        if not checked:
            return ""
        position = await self._publish(SetCriteriaEvent(checked))
        logger.info("set the criteria of %d ids", len(checked))
        return position

    async def disconnect(self, ids: Any, reason: Any = "", reconnect: Any = "new_token") -> str:
        """Kick every socket of ``ids`` (4005 with ``reason`` and ``reconnect``); the position."""
        body = {"ids": ids, "reason": reason, "reconnect": reconnect}
        return await self._kick(check_kick(body, max_batch=self._config.api_max_batch))

    async def count(self, audience: Any) -> dict[str, Any]:
        """``{"sockets", "listeners", "complete"}`` of the sockets matching ``audience`` now."""
        return await self._count(self._check_count({"audience": audience}))

    async def presence(
        self, audience: Any, limit: Any = 1_000, cursor: Any = None
    ) -> dict[str, Any]:
        """``POST /_bow/presence`` (section 18): a page of the listeners matching ``audience``
        now, on every instance, with exact counts."""
        body = {"audience": audience, "limit": limit, "cursor": cursor}
        return await self._presence(self._check_presence(body))

    async def online(self, ids: Any) -> dict[str, Any]:
        """``POST /_bow/online``: those of ``ids`` with an authenticated socket anywhere."""
        return await self._online(check_online({"ids": ids}))

    async def receipt(self, message_id: str) -> dict[str, Any] | None:
        """The receipt of ``message_id`` (section 17) from every instance's report; None when
        none reported it (unknown, asked for none, or past ``receipts.ttl``)."""
        if not MESSAGE_ID.fullmatch(message_id):
            return None
        reports, live = await self._backplane.reports(message_id)
        receipt = merged_receipt(message_id, reports, live, max_ids=self._config.receipts_max_ids)
        if receipt is not None:
            await self.whole_base.fill_missed(receipt, reports)
        return receipt

    async def reach(self, audience: Any) -> dict[str, Any] | None:
        """``POST /_bow/reach`` (section 20): the listeners of the audience index matching
        ``audience``, and how many of them are connected now; None without an index."""
        return await self.whole_base.reach(self._check_count({"audience": audience}))

    async def _get_receipt(self, request: web.Request) -> web.StreamResponse:
        try:
            receipt = await self.receipt(request.match_info["id"])
        except BackplaneUnavailable as error:
            raise unavailable(error.retry_after) from error
        if receipt is None:
            raise web.HTTPNotFound(
                text="404: no receipt for this message id: unknown, asked for none "
                "(Bow-Receipt), or past receipts.ttl"
            )
        return web.Response(body=dumps(receipt), content_type="application/json")

    def add_routes(
        self,
        add_post: Callable[[str, Handler], None],
        inbound_paths: Iterable[str],
        add_get: Callable[[str, Handler], None] | None = None,
    ) -> None:
        """``POST {api.prefix}/criteria|disconnect|count|presence|online|reach`` (405 for other
        methods), each through ``add_post(path, handler)`` (which puts it behind the inbounds'
        credentials), and ``GET {api.prefix}/receipts/{id}`` through ``add_get``."""
        prefix = self._config.api_prefix
        if add_get is not None:
            add_get(f"{prefix}/receipts/{{id}}", self._get_receipt)
        check_inbound_paths(inbound_paths, prefix)
        add_post(f"{prefix}/criteria", self._handler(self._post_criteria))
        add_post(f"{prefix}/disconnect", self._handler(self._post_disconnect))
        add_post(f"{prefix}/count", self._handler(self._post_count, limited=True))
        add_post(f"{prefix}/presence", self._handler(self._post_presence, limited=True))
        add_post(f"{prefix}/online", self._handler(self._post_online, limited=True))
        add_post(f"{prefix}/reach", self._handler(self._post_reach, limited=True))

    async def _kick(self, kick: KickEvent) -> str:
        if not kick.ids:
            return ""
        position = await self._publish(kick)
        logger.info("kicked %d ids (reconnect: %s)", len(kick.ids), kick.reconnect)
        return position

    def _check_count(self, body: Any) -> list[Query]:
        config = self._config
        return check_count(
            body, max_queries=config.max_queries, max_predicates=config.max_predicates
        )

    async def _count(self, audience: list[Query]) -> dict[str, Any]:
        backplane = self._backplane
        request_id = secrets.token_hex(8)
        ask = partial(self._publish, CountEvent(request_id, audience))
        answers, complete = await backplane.answers(request_id, ask, self._config.count_timeout)
        return summed(answers, complete, self._config.count_max_ids)

    def _check_presence(self, body: Any) -> tuple[list[Query], int, str | None]:
        config = self._config
        return check_presence(
            body, max_queries=config.max_queries, max_predicates=config.max_predicates
        )

    async def _presence(self, asked: tuple[list[Query], int, str | None]) -> dict[str, Any]:
        audience, limit, cursor = asked
        request_id = secrets.token_hex(8)
        ask = partial(self._publish, PresenceEvent(request_id, audience, cursor, limit))
        answers, complete = await self._backplane.answers(
            request_id, ask, self._config.count_timeout
        )
        return merged_presence(answers, complete, limit)

    async def _online(self, ids: list[ListenerId]) -> dict[str, Any]:
        if not ids:
            return {"online": [], "complete": True}
        request_id = secrets.token_hex(8)
        ask = partial(self._publish, PresenceEvent(request_id, ids=ids))
        answers, complete = await self._backplane.answers(
            request_id, ask, self._config.count_timeout
        )
        return merged_online(answers, complete, ids)

    async def _post_presence(self, body: Any) -> web.Response:
        result = await self._presence(self._check_presence(body))
        return web.Response(body=dumps(result), content_type="application/json")

    async def _post_online(self, body: Any) -> web.Response:
        result = await self._online(check_online(body))
        return web.Response(body=dumps(result), content_type="application/json")

    async def _post_reach(self, body: Any) -> web.Response:
        result = await self.whole_base.reach(self._check_count(body))
        if result is None:
            raise web.HTTPNotFound(text=NO_INDEX)
        return web.Response(body=dumps(result), content_type="application/json")

    async def _post_criteria(self, body: Any) -> web.Response:
        return _no_content(await self.set_criteria(body))

    async def _post_disconnect(self, body: Any) -> web.Response:
        kick = check_kick(body, max_batch=self._config.api_max_batch)
        return _no_content(await self._kick(kick))

    async def _post_count(self, body: Any) -> web.Response:
        result = await self._count(self._check_count(body))
        return web.Response(body=dumps(result), content_type="application/json")

    def _handler(
        self, operation: Callable[[Any], Awaitable[web.Response]], *, limited: bool = False
    ) -> Handler:
        """``operation`` on the JSON body: 422 for its ``ValueError``, 503 when the backplane
        refuses; ``limited``: 429 over ``api.max_counts_per_second``."""
        timeout = self._config.inbound_timeout

        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                if limited and not self._counts.take():
                    raise web.HTTPTooManyRequests(
                        text=f"429: over api.max_counts_per_second "
                        f"({self._config.max_counts_per_second:g}) on this instance",
                        headers={hdrs.RETRY_AFTER: str(self._retry_after)},
                    )
                body = await read_json(request, timeout)
                try:
                    return await operation(body)
                except ValueError as error:
                    raise unprocessable(str(error)) from None
                except BackplaneUnavailable as error:
                    raise unavailable(error.retry_after) from error
            except web.HTTPException as error:
                level = logging.WARNING if error.status >= 500 else logging.INFO
                cause = f" ({error.__cause__})" if error.__cause__ is not None else ""
                text = error.text
                logger.log(level, "refused %s %s: %s%s", request.method, request.path, text, cause)
                raise

        return handle


def _no_content(position: str) -> web.Response:
    return web.Response(status=204, headers={POSITION_HEADER: position} if position else None)
