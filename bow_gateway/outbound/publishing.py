"""Client publish (``clients.md`` section 12): what a connection publishes is taken exactly as
an inbound message (validated, enriched, sized, positioned, through the backplane), after the
outbound's ``create_message_from_publish`` made it a message. A refusal is a
:class:`PublishRefused` whose text the client is told (Flywheel: on its errors topic)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from ..backplanes import BackplaneUnavailable
from ..core.enrichers import EnricherRefused, EnricherTimeout
from ..core.message import Message, MessageEvent, event_bytes, validate_message
from ..core.message_ids import new_id
from ..core.plugins import OutboundPlugin
from ..runtime.userfn import call_user_function, describe

Published = Callable[[list[MessageEvent]], Awaitable[list[tuple[str, int | None]]]]
"""Events to the backplane: each one's position and, where its topic keeps a history, sequence."""
Enrich = Callable[[list[Message]], Awaitable[list[Message]]]


class PublishRefused(Exception):
    """A client's publish was not accepted; the text says why (nothing internal in it)."""


class ClientPublish:
    """Takes one client publish to the backplane, or raises :class:`PublishRefused`."""

    def __init__(
        self,
        publish: Published,
        *,
        enrich: Enrich | None = None,
        timeout: float = 5.0,
        max_queries: int = 1_000,
        max_predicates: int = 32,
        max_event_bytes: int = 262_144,
    ) -> None:
        self._publish = publish
        self._enrich = enrich
        self._timeout = timeout
        self._max_queries = max_queries
        self._max_predicates = max_predicates
        self._max_event_bytes = max_event_bytes

    async def __call__(
        self,
        outbound: OutboundPlugin,
        details: Mapping[str, Any] | None,
        topic: str,
        body: str,
        *,
        extra: Mapping[str, Any] | None = None,
    ) -> tuple[str, int | None]:
        """Publish what ``outbound``'s function makes of the publish: its position, and its
        sequence when its topic keeps a history. ``extra``: fields the protocol adds to the
        message unless the function set them (Gobbler's headers and publisher ids)."""
        create = outbound.create_message_from_publish
        if create is None:
            raise PublishRefused("this gateway takes no publish from clients")
        timeout = self._timeout
        try:
            raw = await call_user_function(partial(create, details, topic), body, timeout)
        except TimeoutError:
            raise PublishRefused(
                f"{describe(create)} did not answer within {timeout:g} s"
            ) from None
        except Exception as error:  # noqa: BLE001 - the user's function refused the publish
            raise PublishRefused(f"the publish was refused: {error}") from None
        if extra and isinstance(raw, Mapping):  # the protocol's own fields, unless set already
            raw = {**extra, **raw}
        try:
            message = validate_message(
                raw,
                max_queries=self._max_queries,
                max_predicates=self._max_predicates,
                client=True,  # no __ or $ name: the gateway's, or the backend's to send
            )
        except ValueError as error:
            raise PublishRefused(f"invalid message: {error}") from None
        if self._enrich is not None:
            try:
                [message] = await self._enrich([message])
            except (EnricherRefused, EnricherTimeout) as error:
                raise PublishRefused(str(error)) from None
        try:
            size = event_bytes(message)
        except ValueError as error:
            raise PublishRefused(f"invalid message: the payload is {error}") from None
        if size > self._max_event_bytes:
            raise PublishRefused(
                f"the event is {size} bytes, over outbound.max_event_bytes "
                f"({self._max_event_bytes})"
            )
        event = MessageEvent(outbound.middleware_version, message, time.time(), None, new_id())
        try:
            [published] = await self._publish([event])
        except BackplaneUnavailable:
            raise PublishRefused("the gateway cannot take messages now: retry later") from None
        return published
