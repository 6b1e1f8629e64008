"""Admission: the one way a connection of any protocol enters the index.

Credentials become listener details, then criteria (the user's functions); then the rules of
section 8 (an id never changes, anonymous may take one), the places of an id on every instance
(``max_sockets_per_id``) and of anonymous connections on this one (``max_anonymous``), a kick or a
``POST /_bow/criteria`` that came while the functions ran; then the index. A protocol says how it
tells its client (:class:`~.expiry.Refusal`: an alert and a close, or an HTTP answer), never what
the rules are.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..core import codes
from ..core.codes import TokenExpired
from ..core.criteria import (
    ID_KEY,
    Criteria,
    ListenerId,
    validate_criteria,
    validate_listener_details,
)
from ..core.message import CriteriaEvent
from ..core.plugins import OutboundPlugin, WatchesCriteria
from ..runtime.userfn import call_user_function, describe
from .connection import Connection, logger
from .expiry import Expiry, Refusal
from .parts import Sockets

Prepare = Callable[[ListenerId | None], Awaitable[None]]
"""What a protocol does once a connection has its places, before it is indexed (SSE: check its
filters, start the stream, hold the filters); it may raise :class:`~.expiry.Refusal`."""


class Arrivals(Protocol):
    """Told of each connection that took an id and of each such connection gone (the webhooks'
    ``listener.online`` and ``listener.offline``); never awaited, so never in a socket's way."""

    def arrived(self, listener_id: ListenerId, sid: str, protocol: str) -> None: ...

    def left(self, listener_id: ListenerId, sid: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Admitted:
    """A connection :meth:`Admission.admit` indexed, and what :meth:`Admission.share` needs."""

    listener_id: ListenerId | None
    details: Mapping[str, Any] | None
    criteria: Criteria
    basis: str | None  # the last position before the user's functions ran
    refreshes: int  # the middleware's refreshes begun before they ran


class Admission:
    """Admits the connections of every protocol of :class:`~.sockets.SocketOutbound`, holds
    their places, and lets them go."""

    def __init__(
        self,
        outbound: Sockets,
        *,
        claim: Callable[[str, str, int], Awaitable[bool]] | None = None,
        release: Callable[[str, str], Awaitable[None]] | None = None,
        arrivals: Arrivals | None = None,
    ) -> None:
        self._outbound = outbound
        self._claim = claim
        self._release = release
        self.arrivals = arrivals
        self._refreshes: dict[str, int] = {}  # per middleware version: refreshes begun
        self._anonymous: set[str] = set()  # the anonymous connections held (max_anonymous)
        self.expiry = Expiry(outbound)

    async def admit(
        self,
        connection: Connection,
        credentials: Any,
        *,
        caught_up: Callable[[], Awaitable[None]] | None = None,
        prepare: Prepare | None = None,
        keep_details: bool = False,
    ) -> Admitted | None:
        """Authenticate ``connection`` (again) with ``credentials`` (None: anonymous) and index
        it under its criteria; None when it went (or is being closed) meanwhile.

        :class:`~.expiry.Refusal` when it may not be admitted: its credentials refused, another
        id than the one it holds, no place left, kicked. ``caught_up`` runs after the user's
        functions (protocol 2 lets the consumer reach ``since``); ``keep_details``: the
        connection keeps its listener details (Flywheel's publishes are given them)."""
        outbound = self._outbound
        middleware_version = connection.outbound.middleware_version
        basis = outbound.history.last  # control changes after it were not seen by the functions
        refreshes = self._refreshes.get(middleware_version, 0)
        try:
            details, criteria = await self._criteria_for(connection, credentials)
        except Refusal:
            outbound.metrics.authentications.labels(connection.outbound.version, "refused").inc()
            raise
        if caught_up is not None:
            await caught_up()
        if self._gone(connection):
            return None
        listener_id: ListenerId | None = None if details is None else details["id"]
        upgrade = connection.listener_id is None and listener_id is not None  # from anonymous
        if connection.authenticated and listener_id != connection.listener_id and not upgrade:
            text = "a connection cannot change its id: connect a new one"
            raise Refusal(text, codes.ID_CHANGED, kind=None)
        if listener_id is not None and connection.listener_id is None:
            if not await self._take_place(connection, listener_id):
                return None
        elif listener_id is None:
            self._take_anonymous(connection)
        if prepare is not None:
            await prepare(listener_id)
            if self._gone(connection):
                return None
        if listener_id is not None:
            control = outbound.history.changes.control_after(basis, listener_id)
            if control is not None and control[0] == "kick":
                kick = control[1]
                text = kick.reason or "kicked"
                raise Refusal(text, codes.KICKED, kind=None, reconnect=kick.reconnect)
            if control is not None:  # POST /_bow/criteria while the functions ran: it wins
                criteria = {**control[1], ID_KEY: listener_id}
        first = connection.listener_id is None
        self._index(connection, listener_id, details, criteria)
        if first and listener_id is not None and self.arrivals is not None:
            self.arrivals.arrived(listener_id, connection.sid, connection.codec.protocol)
        if keep_details:
            connection.details = details
        outbound.metrics.authentications.labels(connection.outbound.version, "accepted").inc()
        logger.info(
            "%s connection %s authenticated as listener %r",
            connection.codec.protocol,
            connection.sid,
            listener_id,
        )
        return Admitted(listener_id, details, criteria, basis, refreshes)

    def refuse(self, connection: Connection, refusal: Refusal) -> None:
        """Close ``connection`` for ``refusal``: an alert (or its protocol's frame), a close."""
        code, kind, reconnect = refusal.code, refusal.kind, refusal.reconnect
        self._outbound.close(connection, code, str(refusal), kind=kind, reconnect=reconnect)

    async def share(self, connection: Connection, admitted: Admitted) -> None:
        """Give every instance the listener's new criteria (all its sockets take them); nothing
        for an anonymous connection."""
        listener_id = admitted.listener_id
        if listener_id is None:
            return
        outbound = self._outbound
        middleware_version = connection.outbound.middleware_version
        criteria = admitted.criteria
        if self._refreshes.get(middleware_version, 0) != admitted.refreshes:
            # The middleware announced a change while these criteria were read (and skipped
            # this listener, not indexed yet): they may be stale, read them again.
            await self.refresh(middleware_version, [listener_id])
            criteria = outbound.indices[middleware_version].criteria_of(listener_id) or criteria
        event = CriteriaEvent(middleware_version, listener_id, criteria, admitted.basis)
        try:
            await outbound.publish(event)
        except Exception as error:  # noqa: BLE001 - the socket is served here all the same
            logger.warning("could not share the criteria of listener %r: %s", listener_id, error)

    def _gone(self, connection: Connection) -> bool:
        """Whether ``connection`` went, or is being closed, while admission awaited."""
        return (
            self._outbound.connections.get(connection.sid) is not connection
            or connection.closing is not None
        )

    async def _take_place(self, connection: Connection, listener_id: ListenerId) -> bool:
        """Claim a place among the id's sockets on every instance (:class:`~.expiry.Refusal`
        4009 when there is none); False when the connection went meanwhile."""
        limit = self._outbound.settings.max_sockets_per_id
        if self._claim is None or not limit:
            return True
        try:
            claimed = await self._claim(_key(listener_id), connection.sid, limit)
        except Exception as error:  # noqa: BLE001 - a backplane down must not refuse everyone
            logger.warning("could not count the sockets of listener %r: %s", listener_id, error)
            return True
        if self._gone(connection):
            if claimed:
                self._outbound.spawn(self._give_back(listener_id, connection.sid))
            return False
        if not claimed:
            text = f"listener already has {limit} sockets"
            raise Refusal(text, codes.TOO_MANY_SOCKETS, kind=None)
        connection.claimed = True
        return True

    def _take_anonymous(self, connection: Connection) -> None:
        """Hold a place among this instance's anonymous connections (kept until the connection
        goes or takes an id), :class:`~.expiry.Refusal` 4009 when there is none. Synchronous:
        two connections cannot take the last place."""
        anonymous = self._anonymous
        if connection.sid in anonymous:
            return
        limit = self._outbound.settings.max_anonymous
        if limit and len(anonymous) >= limit:
            text = f"this instance already holds {limit} anonymous connections"
            raise Refusal(text, codes.TOO_MANY_SOCKETS, kind=None)
        anonymous.add(connection.sid)

    def _index(
        self,
        connection: Connection,
        listener_id: ListenerId | None,
        details: Mapping[str, Any] | None,
        criteria: Criteria,
    ) -> None:
        """Hold the connection under its (new) criteria, from the current position on."""
        outbound = self._outbound
        deadline = outbound.deadlines.pop(connection.eio_sid, None)
        if deadline is not None:
            deadline.cancel()
        key = listener_id if listener_id is not None else ("anonymous", connection.sid)
        if connection.key != key:
            self._unindex(connection)
            outbound.indices[connection.outbound.middleware_version].add(connection, key, criteria)
            connection.key = key
            outbound.metrics.sockets_authenticated.labels(
                connection.outbound.version, connection.codec.protocol
            ).inc()
            if connection.codec.positioned:
                outbound.positioned.add(connection)
                connection.positioned_at = time.monotonic()
        else:
            outbound.indices[connection.outbound.middleware_version].update(key, criteria)
            outbound.metrics.refreshes.inc()
        connection.listener_id = listener_id
        if listener_id is not None and self._anonymous:
            self._anonymous.discard(connection.sid)  # an anonymous connection took an id
        if isinstance(
            outbound.middlewares[connection.outbound.middleware_version], WatchesCriteria
        ):
            connection.details = details  # to recompute the criteria when they change
        self.expiry.arm(connection, None if details is None else details.get("exp"))

    async def _criteria_for(
        self, connection: Connection, token: Any
    ) -> tuple[Mapping[str, Any] | None, Criteria]:
        """Listener details and criteria for ``token`` (None: anonymous), or a Refusal."""
        outbound = connection.outbound
        if token is None:
            if outbound.anonymous_criteria is None:
                raise Refusal("this outbound admits no anonymous connection: send a token")
            return None, dict(outbound.anonymous_criteria)
        timeout = self._outbound.settings.auth_timeout
        listener_fn = outbound.create_listener_details_from_token
        try:
            details = validate_listener_details(
                await call_user_function(listener_fn, token, timeout)
            )
        except TimeoutError:
            raise Refusal(f"{describe(listener_fn)} did not answer within {timeout:g} s") from None
        except TokenExpired as error:  # already expired: 4003, as an exp already past
            raise Refusal(f"the token has expired: {error}", codes.TOKEN_EXPIRED) from None
        except Exception as error:  # noqa: BLE001 - a refusal, whatever the user's code raised
            raise Refusal(f"the token was refused: {error}") from None
        self.expiry.check(connection, details)
        listener_id = details["id"]
        return details, await self._criteria(outbound, details, listener_id)

    async def _criteria(
        self, outbound: OutboundPlugin, details: Mapping[str, Any], listener_id: ListenerId
    ) -> Criteria:
        timeout = self._outbound.settings.auth_timeout
        criteria_fn = self._outbound.middlewares[outbound.middleware_version]
        try:
            raw = await call_user_function(criteria_fn, details, timeout)
        except TimeoutError:
            raise Refusal(f"{describe(criteria_fn)} did not answer within {timeout:g} s") from None
        except LookupError as error:  # the middleware does not know this listener: say so
            logger.info("%s refused listener %r: %s", describe(criteria_fn), listener_id, error)
            raise Refusal(str(error)) from None
        except Exception:  # noqa: BLE001 - logged with its traceback, then a refusal
            logger.exception("%s raised for listener %r", describe(criteria_fn), listener_id)
            raise Refusal(f"no criteria could be built for listener {listener_id!r}") from None
        try:
            return validate_criteria(raw, listener_id)
        except ValueError as error:
            raise Refusal(f"invalid criteria for listener {listener_id!r}: {error}") from None

    def _unindex(self, connection: Connection) -> None:
        """Take an authenticated connection out of its index (it stays connected)."""
        if connection.key is None:
            return
        outbound = self._outbound
        outbound.metrics.sockets_authenticated.labels(
            connection.outbound.version, connection.codec.protocol
        ).dec()
        outbound.indices[connection.outbound.middleware_version].remove(connection, connection.key)
        outbound.positioned.discard(connection)
        connection.key = None

    def forget(self, connection: Connection) -> None:
        """The connection is gone: unindex it, cancel its timers, give back its place."""
        self._unindex(connection)
        if connection.listener_id is not None and self.arrivals is not None:
            self.arrivals.left(connection.listener_id, connection.sid)
        self._anonymous.discard(connection.sid)
        self._outbound.writer.forget(connection)
        if connection.timer is not None:
            connection.timer.cancel()
            connection.timer = None
        if connection.claimed and connection.listener_id is not None:
            connection.claimed = False
            self._outbound.spawn(self._give_back(connection.listener_id, connection.sid))

    async def _give_back(self, listener_id: ListenerId, sid: str) -> None:
        if self._release is None:
            return
        try:
            await self._release(_key(listener_id), sid)
        except Exception as error:  # noqa: BLE001 - the place expires with its instance anyway
            logger.info("could not release a place of listener %r: %s", listener_id, error)

    async def refresh(
        self, middleware_version: str, listener_ids: list[ListenerId] | None = None
    ) -> int:
        """Recompute the criteria of held listeners (all, or those named) and re-index them.

        Nobody is disconnected: a listener whose criteria can no longer be built keeps only
        ``__id``, so it stops receiving what its old criteria matched. Returns how many changed.
        """
        self._refreshes[middleware_version] = self._refreshes.get(middleware_version, 0) + 1
        index = self._outbound.indices[middleware_version]
        criteria_fn = self._outbound.middlewares[middleware_version]
        timeout = self._outbound.settings.auth_timeout
        changed = 0
        held = index.listener_ids() if listener_ids is None else listener_ids
        for position, listener_id in enumerate(held, 1):
            details = next(
                (c.details for c in index.sockets_of(listener_id) if c.details is not None), None
            )
            if details is None or isinstance(listener_id, tuple):
                continue  # not held here, or anonymous
            try:
                raw = await call_user_function(criteria_fn, details, timeout)
                criteria = validate_criteria(raw, listener_id)
            except Exception as error:  # noqa: BLE001 - refused now: keep the socket, not the access
                logger.info("listener %r keeps no criteria: %s", listener_id, error)
                criteria = {ID_KEY: listener_id}
            changed += index.update(listener_id, criteria)
            if position % 100 == 0:
                await asyncio.sleep(0)  # a long refresh must not starve delivery
        return changed


def _key(listener_id: ListenerId) -> str:
    """A listener id as the key of its places (JSON: 1 and "1" are different ids)."""
    return json.dumps(listener_id)
