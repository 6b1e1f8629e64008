"""``Bow.publish``: a message from the process that runs the gateway, taken as an inbound takes
one (checked, enriched, sized, given an id), with an optional idempotency key (contract section
16): a repeat of the same message within ``inbound.idempotency_window`` returns the first
``(id, position)`` and publishes nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from aiohttp import web

from ..backplanes import AlreadyAccepted, BackplaneUnavailable, Claim
from ..core.message import Message
from ..core.message_ids import new_ids
from .idempotency import Keys, checked_key, repeated
from .inbound import Enrich as EnrichMany
from .inbound import PublishMany, check_size, checked_messages, enriched, message_events
from .receipt_headers import Asked, checked_receipt

EMBEDDED_PATH = "Bow.publish"  # the keys' scope: an inbound path's own never collide with it


class EmbeddedPublish:
    """What ``Bow.publish`` does, once the gateway started."""

    def __init__(
        self,
        publish: PublishMany,
        middleware_versions: Sequence[str],
        *,
        enrich: EnrichMany | None = None,
        max_queries: int = 1_000,
        max_predicates: int = 32,
        max_event_bytes: int = 262_144,
        idempotency_window: float = 600.0,
    ) -> None:
        self._publish = publish
        self._versions = list(middleware_versions)
        self._enrich = enrich
        self._limits: dict[str, Any] = {
            "max_queries": max_queries,
            "max_predicates": max_predicates,
        }
        self._max_event_bytes = max_event_bytes
        self._keys = Keys(EMBEDDED_PATH, window=idempotency_window)

    async def publish(
        self,
        message: Mapping[str, Any],
        idempotency_key: str | None = None,
        middleware_version: str | None = None,
        receipt: int | None = None,
        fallback: int | None = None,
    ) -> tuple[str, str]:
        """The message's ``(id, position)``; ``ValueError`` for an invalid message or key, or a
        key used for another message; :class:`~bow_gateway.backplanes.BackplaneUnavailable`
        when the backplane cannot take it (retry with the same key). ``receipt`` and
        ``fallback``: seconds, as ``Bow-Receipt`` and ``Bow-Fallback``."""
        version = self._version(middleware_version)
        try:
            [checked] = checked_messages(message, False, 1, self._limits)
            if self._enrich is not None:
                [checked] = await enriched(self._enrich, [checked], False)
            check_size(checked, "", self._max_event_bytes)
            checked_key(idempotency_key)
            asked = checked_receipt(_text(receipt), _text(fallback))
        except web.HTTPException as error:
            raise _refused(error) from None
        ids = new_ids(1)
        if idempotency_key is None:
            positions = await self._publish(message_events(version, [checked], ids, asked), None)
            return ids[0], positions[-1]
        body = orjson.dumps(dict(message), option=orjson.OPT_SORT_KEYS, default=str)
        claim = self._keys.claim(idempotency_key, body, ids, False)
        try:
            self._keys.start(idempotency_key)
        except web.HTTPConflict:
            raise BackplaneUnavailable("a publish with this key is under way: retry") from None
        try:
            return await self._claimed(version, checked, ids, claim, asked)
        finally:
            self._keys.end(idempotency_key)

    async def _claimed(
        self, version: str, message: Message, ids: list[str], claim: Claim, asked: Asked
    ) -> tuple[str, str]:
        try:
            events = message_events(version, [message], ids, asked)
            positions = await self._publish(events, claim)
            return ids[0], positions[-1]
        except AlreadyAccepted as taken:
            try:
                first = repeated(taken, claim)
            except web.HTTPException as error:
                raise _refused(error) from None
            return first.ids[0], first.position

    def _version(self, asked: str | None) -> str:
        if asked is None:
            if len(self._versions) != 1:
                raise ValueError("name the middleware_version: this gateway has several")
            return self._versions[0]
        if asked not in self._versions:
            known = ", ".join(self._versions)
            raise ValueError(f"unknown middleware_version {asked!r}: this gateway has {known}")
        return asked


def _text(seconds: int | None) -> str | None:
    """Seconds given to ``Bow.publish`` as the header would carry them (a bool is no number)."""
    if seconds is None:
        return None
    return str(seconds) if type(seconds) is int else repr(seconds)


def _refused(error: web.HTTPException) -> ValueError:
    """An inbound's ``422`` as ``Bow.publish`` raises it."""
    return ValueError((error.text or error.reason).removeprefix("422: "))
