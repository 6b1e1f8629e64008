"""Expiry (section 8): ``exp`` from the listener details, 4100 at ``exp`` on protocol 2, then
4003 and a disconnect at ``exp + outbound.expiry_grace`` (SSE: only the latter, as its client
cannot re-authenticate); protocol 1 only when configured."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Final

from ..core import codes
from .connection import Connection
from .parts import Sockets

MAX_EXP: Final = 253_402_300_800  # 10000-01-01: a later exp is not a time


class Refusal(Exception):
    """A connection is not admitted, with ``code``; the text is what the client reads in its
    alert. ``kind``: the disconnect's metric label (``refused``: its credentials or its request;
    None: the code's reason, for the rules of admission); ``reconnect``: the code's own when
    None."""

    def __init__(
        self,
        text: str,
        code: codes.Code = codes.AUTH_REFUSED,
        *,
        kind: str | None = "refused",
        reconnect: str | None = None,
    ) -> None:
        super().__init__(text)
        self.code = code
        self.kind = kind
        self.reconnect = reconnect


class Expiry:
    """The expiry timers of :class:`~.sockets.SocketOutbound`'s connections."""

    def __init__(self, outbound: Sockets) -> None:
        self._outbound = outbound

    def check(self, connection: Connection, details: Mapping[str, Any]) -> None:
        """``exp`` must be a number of seconds since the epoch, in the future (when enforced)."""
        if not self._enforced(connection) or details.get("exp") is None:
            return
        exp = details["exp"]
        if isinstance(exp, bool) or not isinstance(exp, int | float):
            raise Refusal(f"exp must be seconds since the Unix epoch, not {type(exp).__name__}")
        if not 0 < exp < MAX_EXP:  # NaN too
            raise Refusal(f"exp must be seconds since the Unix epoch, not {exp!r}")
        if exp <= time.time():
            raise Refusal("the token has expired", codes.TOKEN_EXPIRED)

    def _enforced(self, connection: Connection) -> bool:
        return connection.codec.coded or self._outbound.settings.expire_v1_sockets

    def arm(self, connection: Connection, exp: Any) -> None:
        """At ``exp``: 4100 (protocol 2); at ``exp + grace``: 4003 and a disconnect."""
        if connection.timer is not None:
            connection.timer.cancel()
            connection.timer = None
        if exp is None or not self._enforced(connection):
            connection.exp = None
            return
        connection.exp = float(exp)
        loop = asyncio.get_running_loop()
        left = max(0.0, connection.exp - time.time())
        if connection.codec.reauthenticates:
            connection.timer = loop.call_later(left, self._refresh_required, connection)
        else:
            grace = self._outbound.settings.expiry_grace
            connection.timer = loop.call_later(left + grace, self._expired, connection)

    def _refresh_required(self, connection: Connection) -> None:
        outbound = self._outbound
        grace = outbound.settings.expiry_grace
        outbound.writer.write(
            connection,
            connection.codec.alert(
                codes.REFRESH_REQUIRED,
                f"the token expires: authenticate again within {grace:g} s",
                fatal=False,
                session=connection.session,
            ),
        )
        loop = asyncio.get_running_loop()
        connection.timer = loop.call_later(grace, self._expired, connection)

    def _expired(self, connection: Connection) -> None:
        connection.timer = None
        self._outbound.metrics.expiries.inc()
        self._outbound.close(connection, codes.TOKEN_EXPIRED, "the token expired")
