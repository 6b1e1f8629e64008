"""Flywheel's sessionIds (``clients.md`` sections 11 and 12): the connections of this instance
each one reaches (``$remote/{sessionId}/rx/...``), and the lease that keeps it to one identity on
every instance.

A sessionId belongs to one identity at a time: a listener id, or every anonymous connection
(:data:`ANONYMOUS`). While a connection of this instance is bound with it, the instance holds its
lease on the backplane (``session:{sessionId}``, owned by that identity), renews it every third of
``ttl`` and lets it go when the last one leaves; the hold of an instance that died ends with its
``ttl``. The operations on one sessionId run one at a time (a lock each): a let-go never
overtakes a bind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Final

from ..backplanes.base import BackplaneUnavailable
from ..core.message import dumps
from ..wire.frames import websocket_frame
from .connection import Connection, logger  # rate-limited: an outage is one line per session

ANONYMOUS: Final = "anonymous"  # a listener id's owner is its JSON: never this
LEASE_TTL: Final = 30.0  # seconds a hold outlives its last renewal (a dead instance's)
Hold = Callable[[str, str, float], Awaitable[bool]]
LetGo = Callable[[str, str], Awaitable[None]]


def identity(connection: Connection) -> str:
    """Whose ``connection``'s sessions are: its listener id (JSON: 1 and "1" are different ids),
    or every anonymous connection's."""
    listener_id = connection.listener_id
    return ANONYMOUS if listener_id is None else json.dumps(listener_id)


class _Lease:
    __slots__ = ("owner", "renewed")

    def __init__(self, owner: str, renewed: float) -> None:
        self.owner = owner
        self.renewed = renewed  # time.monotonic() when the last hold that succeeded was asked


class Sessions:
    """The sessionIds bound on this instance (:attr:`bound`, what delivery reads) and their
    leases; ``hold``/``let_go``: the backplane's (None: this instance alone decides)."""

    def __init__(
        self,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        write: Callable[[Connection, bytes], object],
        hold: Hold | None = None,
        let_go: LetGo | None = None,
        ttl: float = LEASE_TTL,
    ) -> None:
        self.bound: dict[str, set[Connection]] = {}
        self._leases: dict[str, _Lease] = {}  # the sessions this instance holds, by sessionId
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # a lock and its users
        self._spawn = spawn
        self._write = write
        self._hold = hold
        self._let_go = let_go
        self._ttl = ttl

    def owns(self, connection: Connection) -> bool:
        """Whether ``connection``'s session is held for its identity (not: it changed since
        the bind, anonymous to an id)."""
        lease = self._leases.get(connection.session or "")
        return lease is not None and lease.owner == identity(connection)

    async def join(self, connection: Connection, session: str) -> bool:
        """Bind ``connection`` to ``session`` under its identity, leaving the one it had; False
        when another identity holds it, here or on another instance. :class:`BackplaneUnavailable`
        when the backplane cannot say. Either way a connection whose identity changed leaves
        ``session`` if it was its own."""
        owner = identity(connection)
        async with self._locked(session):
            if connection.session == session and not self.owns(connection):
                self._unbind(connection)  # its identity changed: bound again below, or not
            lease = self._leases.get(session)
            if lease is not None and lease.owner != owner and session not in self.bound:
                await self._release(session)  # no connection here uses it any more
                lease = None
            if lease is None:
                asked = time.monotonic()
                if self._hold is not None and not await self._hold(_key(session), owner, self._ttl):
                    return False
                self._leases[session] = _Lease(owner, asked)
            elif lease.owner != owner:
                return False
            if connection.session != session:
                self.leave(connection)
                connection.session = session
                self.bound.setdefault(session, set()).add(connection)
            return True

    def leave(self, connection: Connection) -> None:
        """Stop routing ``$remote/{sessionId}/rx/...`` to ``connection``; the lease is let go
        (in the background) once no connection here is bound with the session."""
        session = self._unbind(connection)
        if session is not None:
            self._spawn(self._let_go_unused(session))

    async def renew(self) -> None:
        """Every third of ``ttl``: renew the leases of the sessions bound here (a supervised
        job); see :meth:`_renew`."""
        if self._hold is None:
            return
        while True:
            await asyncio.sleep(self._ttl / 3)
            await asyncio.gather(*(self._renew(session) for session in list(self._leases)))

    async def _renew(self, session: str) -> None:
        """Renew ``session``'s lease, or let it go if unused. A lease another identity took
        (this hold ended while the backplane was out of reach), or one not renewed for two
        thirds of ``ttl`` (it could end before the next renewal), unbinds its connections here,
        each told on ``$remote/{sessionId}/rx/errors``."""
        assert self._hold is not None
        async with self._locked(session):
            lease = self._leases.get(session)
            if lease is None:
                return
            if session not in self.bound:
                with contextlib.suppress(BackplaneUnavailable):
                    await self._release(session)
                return
            asked = time.monotonic()
            try:
                held = await self._hold(_key(session), lease.owner, self._ttl)
                why = "another listener holds it now"
            except BackplaneUnavailable as error:
                if asked - lease.renewed < self._ttl * 2 / 3:
                    return  # renewed at the next turn, before it could end
                logger.warning("could not renew the lease of sessionId %r: %s", session, error)
                held, why = False, "the backplane was out of reach too long"
            if held:
                lease.renewed = asked
                return
            del self._leases[session]
            errors = [
                {"type": "General", "description": f"sessionId {session!r} was let go: {why}"}
            ]
            frame = websocket_frame(f"R $remote/{session}/rx/errors ".encode() + dumps(errors))
            for connection in self.bound.pop(session, ()):
                connection.session = None
                self._write(connection, frame)

    def _unbind(self, connection: Connection) -> str | None:
        """``connection`` leaves its session here; the session if no connection here is left."""
        session, connection.session = connection.session, None
        bound = self.bound.get(session or "")
        if session is None or bound is None:
            return None
        bound.discard(connection)
        if bound:
            return None
        del self.bound[session]
        return session

    async def _let_go_unused(self, session: str) -> None:
        async with self._locked(session):
            if session in self.bound:
                return  # bound again meanwhile, by the same identity: kept
            try:
                await self._release(session)
            except BackplaneUnavailable as error:  # it ends with its ttl
                logger.info("could not let go of sessionId %r: %s", session, error)

    async def _release(self, session: str) -> None:
        """Forget ``session``'s lease here and let it go on the backplane (under its lock)."""
        lease = self._leases.pop(session, None)
        if lease is not None and self._let_go is not None:
            await self._let_go(_key(session), lease.owner)

    @contextlib.asynccontextmanager
    async def _locked(self, session: str) -> AsyncIterator[None]:
        """``session``'s lock, kept while anyone holds or waits for it."""
        lock, users = self._locks.setdefault(session, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[session]


def _key(session: str) -> str:
    return f"session:{session}"
