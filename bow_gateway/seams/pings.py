"""Engine.IO pings for every socket of a server from one timer per tick (:class:`PingWheel`)."""

from __future__ import annotations

import asyncio
import math
from typing import Any, Final, Protocol

from engineio import packet as eio_packet

from ..runtime.ratelimit import rate_limited
from ..wire.frames import websocket_frame

logger = rate_limited("bow_gateway.transport")

PING_TICK: Final = 0.5
"""Seconds between two ticks of the ping wheel: a socket's ping is sent on the first tick after
its ``ping_interval`` (at most this much later)."""
PING_FRAME: Final = websocket_frame(eio_packet.Packet(eio_packet.PING).encode().encode())


class Pinged(Protocol):
    """A socket the wheel pings (a :class:`~.transport.LeanSocket`)."""

    sid: str

    def _ping(self) -> None: ...


class PingWheel:
    """The sockets to ping, by tick: one timer per tick for every socket due then, rather than a
    timer per socket (at 10,000 sockets, 400 timers a second pushed onto and popped off a heap of
    10,000, each of its ~15 comparisons a Python call, and a ``TimerHandle`` per idle socket)."""

    __slots__ = ("_due", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._due: dict[float, set[Pinged]] = {}

    @staticmethod
    def of(server: Any) -> PingWheel:
        """The wheel of engineio's ``server`` on the running loop."""
        loop = asyncio.get_running_loop()
        wheel: PingWheel | None = getattr(server, "_bow_ping_wheel", None)
        if wheel is None or wheel.loop is not loop:
            wheel = server._bow_ping_wheel = PingWheel(loop)
        return wheel

    def add(self, socket: Pinged, delay: float) -> float:
        """Ping ``socket`` at the first tick ``delay`` s from now; that tick."""
        tick = math.ceil((self.loop.time() + delay) / PING_TICK) * PING_TICK
        sockets = self._due.get(tick)
        if sockets is None:
            sockets = self._due[tick] = set()
            self.loop.call_at(tick, self._fire, tick)
        sockets.add(socket)
        return tick

    def discard(self, socket: Pinged, tick: float) -> None:
        sockets = self._due.get(tick)
        if sockets is not None:
            sockets.discard(socket)

    def _fire(self, tick: float) -> None:
        for socket in self._due.pop(tick, ()):
            try:
                socket._ping()
            except Exception:  # one socket's failure must not cost the others their pings
                logger.exception("could not ping Engine.IO connection %s", socket.sid)
