"""Authentication: a token becomes listener details, then criteria; the socket is indexed.

Protocol 1 is Bow's: one ``authenticate``, a second ignored. Protocol 2 (section 8) takes
options (``since``: recovery, section 7), re-authenticates on every later ``authenticate`` (one at
a time), keeps the identity, admits anonymous listeners and enforces ``exp`` with a grace.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .. import codes
from ..codes import TokenExpired
from ..criteria import ID_KEY, Criteria, ListenerId, validate_criteria, validate_listener_details
from ..history import History
from ..message import CriteriaEvent
from ..plugins import OutboundPlugin, WatchesCriteria
from ..userfn import call_user_function, describe
from . import codec
from .connection import Connection, logger
from .expiry import Expiry, Refusal
from .parts import Sockets
from .recovery import ack_result


class Authenticator:
    """Runs ``authenticate`` events for :class:`~.sockets.SocketOutbound`."""

    def __init__(
        self,
        outbound: Sockets,
        *,
        claim: Callable[[str, str, int], Awaitable[bool]] | None = None,
        release: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self._outbound = outbound
        self._claim = claim
        self._release = release
        self._refreshes: dict[str, int] = {}  # per middleware version: refreshes begun
        self._anonymous: set[str] = set()  # the anonymous connections held (max_anonymous)
        self.expiry = Expiry(outbound)

    async def authenticate(self, sid: str, eio_sid: str, args: list[Any], ack_id: Any) -> None:
        outbound = self._outbound
        connection = outbound.connections.get(sid)
        if connection is None or connection.closing is not None:
            return
        if not connection.authenticates.take():
            limit = outbound.settings.max_authenticates_per_minute
            outbound.close(
                connection, codes.TOO_MANY_REQUESTS, f"over {limit} authenticate a minute"
            )
            return
        if connection.proto == 1:
            if connection.busy or connection.authenticated:
                return  # busy, or already authenticated: ignored, as Bow does
            connection.busy = True
            try:
                await self._authenticate(connection, args, ack_id)
            finally:
                connection.busy = False
            return
        if connection.lock is None:
            connection.lock = asyncio.Lock()
        async with connection.lock:  # one at a time, in arrival order
            if connection.closing is None:
                await self._authenticate(connection, args, ack_id)

    async def _authenticate(self, connection: Connection, args: list[Any], ack_id: Any) -> None:
        outbound = self._outbound
        version = connection.outbound.version
        history = outbound.history
        basis = history.last  # control changes after it were not seen by the user's functions
        try:
            token, options = _arguments(connection, args, ack_id)
            if connection.authenticated:
                options = {}  # since belongs to the first authenticate: the rest was delivered
            refreshes = self._refreshes.get(connection.outbound.middleware_version, 0)
            details, criteria = await self._criteria_for(connection, token)
            await _caught_up(history, options.get("since"))
        except Refusal as refusal:
            outbound.metrics.authentications.labels(version, "refused").inc()
            outbound.close(connection, refusal.code, str(refusal), kind="refused")
            return
        if outbound.connections.get(connection.sid) is not connection or connection.closing:
            return  # disconnected (or timed out) while the user's functions ran
        listener_id: ListenerId | None = None if details is None else details["id"]
        upgrade = connection.listener_id is None and listener_id is not None  # from anonymous
        if connection.authenticated and listener_id != connection.listener_id and not upgrade:
            outbound.close(
                connection, codes.ID_CHANGED, "a socket cannot change its id: connect a new one"
            )
            return
        if listener_id is not None and connection.listener_id is None:
            if not await self._take_place(connection, listener_id):
                return
        elif listener_id is None and not self._take_anonymous(connection):
            return
        if listener_id is not None:
            control = history.changes.control_after(basis, listener_id)
            if control is not None and control[0] == "kick":
                kick = control[1]
                outbound.close(
                    connection, codes.KICKED, kick.reason or "kicked", reconnect=kick.reconnect
                )
                return
            if control is not None:  # POST /_bow/criteria while the functions ran: it wins
                criteria = {**control[1], ID_KEY: listener_id}
        self._index(connection, listener_id, details, criteria)
        result = await ack_result(self._outbound, connection, listener_id, criteria, options)
        replay = None if result is None else result.pop("_replay", None)
        outbound.writer.write(connection, codec.ack(ack_id, result, proto=connection.proto))
        outbound.metrics.authentications.labels(version, "accepted").inc()
        logger.info("socket %s authenticated as listener %r", connection.sid, listener_id)
        if replay:
            outbound.writer.begin_replay(connection, replay)  # now: what follows waits behind it
        if listener_id is not None:
            await self._share(connection, listener_id, criteria, refreshes, basis)
        if replay:
            await outbound.writer.replay(connection)

    # -- for the plain WebSocket outbounds (Flywheel's bind, Gobbler's handshake) -----------

    async def admit(self, connection: Connection, credentials: Any) -> bool:
        """Authenticate ``connection`` (again) with ``credentials`` (None: anonymous) under
        section 8's rules, and hold it in its index. :class:`Refusal` for credentials refused;
        False when the connection is being closed instead (another id, the per-id limit, a
        kick: its ``farewell`` says why)."""
        outbound = self._outbound
        version = connection.outbound.version
        basis = outbound.history.last  # control changes after it were not seen by the functions
        refreshes = self._refreshes.get(connection.outbound.middleware_version, 0)
        try:
            details, criteria = await self._criteria_for(connection, credentials)
        except Refusal:
            outbound.metrics.authentications.labels(version, "refused").inc()
            raise
        if connection.closing is not None:
            return False
        listener_id: ListenerId | None = None if details is None else details["id"]
        upgrade = connection.listener_id is None and listener_id is not None
        if connection.authenticated and listener_id != connection.listener_id and not upgrade:
            text = "a connection cannot change its id: connect a new one"
            outbound.close(connection, codes.ID_CHANGED, text)
            return False
        if listener_id is not None and connection.listener_id is None:
            if not await self._take_place(connection, listener_id):
                return False
        elif listener_id is None and not self._take_anonymous(connection):
            return False
        if listener_id is not None:
            control = outbound.history.changes.control_after(basis, listener_id)
            if control is not None and control[0] == "kick":
                kick = control[1]
                outbound.close(
                    connection, codes.KICKED, kick.reason or "kicked", reconnect=kick.reconnect
                )
                return False
            if control is not None:  # POST /_bow/criteria while the functions ran: it wins
                criteria = {**control[1], ID_KEY: listener_id}
        self._index(connection, listener_id, details, criteria)
        connection.details = details  # create_message_from_publish is given them
        outbound.metrics.authentications.labels(version, "accepted").inc()
        logger.info(
            "%s connection %s: listener %r", connection.codec.protocol, connection.sid, listener_id
        )
        if listener_id is not None:
            await self._share(connection, listener_id, criteria, refreshes, basis)
        return connection.closing is None

    # -- for the SSE outbound, which authenticates once, before its stream starts -----------

    async def criteria_for(
        self, connection: Connection, token: Any
    ) -> tuple[Mapping[str, Any] | None, Criteria]:
        """Listener details and criteria for ``token`` (None: anonymous), or :class:`Refusal`."""
        return await self._criteria_for(connection, token)

    async def take_place(self, connection: Connection, listener_id: ListenerId) -> bool:
        """A place among the id's sockets (``max_sockets_per_id``), else 4009 and False."""
        return await self._take_place(connection, listener_id)

    def take_anonymous(self, connection: Connection) -> bool:
        """A place among the instance's anonymous connections (``max_anonymous``), else 4009
        and False."""
        return self._take_anonymous(connection)

    def hold(
        self,
        connection: Connection,
        listener_id: ListenerId | None,
        details: Mapping[str, Any] | None,
        criteria: Criteria,
    ) -> None:
        """Index the connection under its criteria and arm its expiry."""
        self._index(connection, listener_id, details, criteria)

    def refreshes(self, middleware_version: str) -> int:
        """Refreshes begun so far (read before the user's functions run, for :meth:`share`)."""
        return self._refreshes.get(middleware_version, 0)

    async def share(
        self,
        connection: Connection,
        listener_id: ListenerId,
        criteria: Criteria,
        refreshes: int,
        basis: str | None,
    ) -> None:
        """Give every instance the listener's criteria (all its sockets take them)."""
        await self._share(connection, listener_id, criteria, refreshes, basis)

    async def _share(
        self,
        connection: Connection,
        listener_id: ListenerId,
        criteria: Criteria,
        refreshes: int,
        basis: str | None,
    ) -> None:
        """Give every instance the listener's new criteria (all its sockets take them)."""
        outbound = self._outbound
        middleware_version = connection.outbound.middleware_version
        if self._refreshes.get(middleware_version, 0) != refreshes:
            # The middleware announced a change while these criteria were read (and skipped
            # this listener, not indexed yet): they may be stale, read them again.
            await self.refresh(middleware_version, [listener_id])
            criteria = outbound.indices[middleware_version].criteria_of(listener_id) or criteria
        try:
            await outbound.publish(CriteriaEvent(middleware_version, listener_id, criteria, basis))
        except Exception as error:  # noqa: BLE001 - the socket is served here all the same
            logger.warning("could not share the criteria of listener %r: %s", listener_id, error)

    async def _take_place(self, connection: Connection, listener_id: ListenerId) -> bool:
        """Claim a place among the id's sockets on every instance; 4009 when there is none."""
        limit = self._outbound.settings.max_sockets_per_id
        if self._claim is None or not limit:
            return True
        try:
            claimed = await self._claim(_key(listener_id), connection.sid, limit)
        except Exception as error:  # noqa: BLE001 - a backplane down must not refuse everyone
            logger.warning("could not count the sockets of listener %r: %s", listener_id, error)
            return True
        if connection.closing is not None:
            if claimed:
                self._outbound.spawn(self._give_back(listener_id, connection.sid))
            return False
        if not claimed:
            self._outbound.close(
                connection, codes.TOO_MANY_SOCKETS, f"listener already has {limit} sockets"
            )
            return False
        connection.claimed = True
        return True

    def _take_anonymous(self, connection: Connection) -> bool:
        """Hold a place among this instance's anonymous connections (kept until the connection
        goes or takes an id); 4009 when there is none. Synchronous: two connections cannot
        take the last place."""
        anonymous = self._anonymous
        if connection.sid in anonymous:
            return True
        limit = self._outbound.settings.max_anonymous
        if limit and len(anonymous) >= limit:
            text = f"this instance already holds {limit} anonymous connections"
            self._outbound.close(connection, codes.TOO_MANY_SOCKETS, text)
            return False
        anonymous.add(connection.sid)
        return True

    def _index(
        self,
        connection: Connection,
        listener_id: ListenerId | None,
        details: Mapping[str, Any] | None,
        criteria: Criteria,
    ) -> None:
        """Hold the socket under its (new) criteria, from the current position on."""
        outbound = self._outbound
        deadline = outbound.deadlines.pop(connection.eio_sid, None)
        if deadline is not None:
            deadline.cancel()
        key = listener_id if listener_id is not None else ("anonymous", connection.sid)
        if connection.key != key:
            outbound.unindex(connection)
            outbound.index(connection, key, criteria)
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
        outbound = connection.outbound
        if token is None:  # anonymous (checked by _arguments)
            assert outbound.anonymous_criteria is not None
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

    def forget(self, connection: Connection) -> None:
        """The connection is gone: unindex it, cancel its timers, give back its place."""
        self._outbound.unindex(connection)
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


def _arguments(
    connection: Connection, args: list[Any], ack_id: Any
) -> tuple[Any, Mapping[str, Any]]:
    """The token and the options of an ``authenticate``, or a :class:`Refusal` (4000)."""
    if ack_id is None:
        raise Refusal("authenticate needs an acknowledgement callback", codes.BAD_REQUEST)
    token = args[0] if args else None
    options: Any = {}
    if connection.proto == 2:
        if len(args) > 2:
            raise Refusal("authenticate takes (token, options, ack)", codes.BAD_REQUEST)
        options = args[1] if len(args) == 2 else {}
        if not isinstance(options, dict):
            raise Refusal("authenticate's options must be a mapping", codes.BAD_REQUEST)
        since = options.get("since")
        if since is not None and not isinstance(since, str):
            raise Refusal("since must be a position (a string)", codes.BAD_REQUEST)
        if token is None and connection.outbound.anonymous_criteria is not None:
            return None, options
    if token is None or token == "":
        raise Refusal("authenticate needs a token", codes.BAD_REQUEST)
    return token, options


async def _caught_up(history: History, since: Any, wait: float = 1.0) -> None:
    """Let the consumer reach ``since`` (a backend may hand out a 204's position before this
    instance has read it), for at most ``wait`` seconds; recovery then judges it."""
    if not isinstance(since, str) or history.last is None:
        return
    deadline = time.monotonic() + wait
    while history.ahead(since) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def _key(listener_id: ListenerId) -> str:
    """A listener id as the key of its places (JSON: 1 and "1" are different ids)."""
    return json.dumps(listener_id)
