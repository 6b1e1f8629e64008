"""How the gateway finds a dead client, whatever the protocol: one policy, Engine.IO's numbers
(a ping every 25 s, 20 s to answer it). Socket.IO's pings are Engine.IO packets
(:mod:`bow_gateway.seams.pings`), an SSE stream's are comment lines; a plain WebSocket's
(Flywheel, Gobbler, any protocol built on :mod:`.plain_websocket`) are WebSocket pings, sent and
watched here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Final

from .connection import Connection, logger

PING_EVERY: Final = 25.0  # seconds between two pings to a connection (Engine.IO's ping_interval)
PONG_WITHIN: Final = 20.0  # seconds to answer before it is cut off (Engine.IO's ping_timeout)
SWEEP: Final = 1.0  # seconds between two looks at the connections' pings
PING_FRAME: Final = b"\x89\x00"  # a WebSocket ping, empty


class Pings:
    """The WebSocket pings of one endpoint's connections: each is pinged :data:`PING_EVERY`
    seconds after its last pong (or its opening), and cut off when it has not answered within
    :data:`PONG_WITHIN`. One sweep a second looks at every connection: no timer per connection."""

    __slots__ = ("_pings", "_spawn", "_sweeping")

    def __init__(self, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self._spawn = spawn
        # Each connection's [when its next ping is due, when its unanswered one was sent (0: none)]
        self._pings: dict[Connection, list[float]] = {}
        self._sweeping = False

    def add(self, connection: Connection) -> None:
        """Watch a connection just opened."""
        self._pings[connection] = [asyncio.get_running_loop().time() + PING_EVERY, 0.0]
        if not self._sweeping:
            self._sweeping = True
            self._spawn(self._sweep())

    def pong(self, connection: Connection) -> None:
        """The client answered: its next ping is due in :data:`PING_EVERY` seconds."""
        pings = self._pings.get(connection)
        if pings is not None:
            pings[0] = asyncio.get_running_loop().time() + PING_EVERY
            pings[1] = 0.0

    def discard(self, connection: Connection) -> None:
        self._pings.pop(connection, None)

    async def _sweep(self) -> None:
        """While connections are open: ping those due, cut off those that did not answer."""
        try:
            loop = asyncio.get_running_loop()
            while self._pings:
                await asyncio.sleep(SWEEP)
                self._look(loop.time())
        finally:
            self._sweeping = False

    def _look(self, now: float) -> None:
        """One sweep: a function of its own, so that no connection it looked at stays referenced
        (by a loop variable of :meth:`_sweep`'s frame) while the sweep sleeps."""
        for connection, pings in list(self._pings.items()):
            transport = connection.transport
            if transport is None or transport.is_closing():
                continue
            if pings[1] and now - pings[1] > PONG_WITHIN:
                protocol = connection.codec.protocol
                logger.info("%s connection %s: no pong: cut off", protocol, connection.sid)
                connection.closing = connection.closing or "ping timeout"
                transport.abort()
            elif not pings[1] and now >= pings[0]:
                pings[1] = now
                transport.write(PING_FRAME)
