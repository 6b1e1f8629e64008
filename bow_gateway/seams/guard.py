"""What a client may send over Engine.IO, whatever the transport: only what Engine.IO clients send
(``PONG``, text ``MESSAGE``, ``CLOSE``), at a bounded rate; anything else is a
:class:`ProtocolViolation`, which closes its connection."""

from __future__ import annotations

from typing import Final, Protocol

from engineio import exceptions as eio_exceptions
from engineio import packet as eio_packet

from ..runtime.ratelimit import TokenBucket

INCOMING_RATE: Final = 20.0
INCOMING_BURST: Final = 100.0
"""Packets a client may send: ``INCOMING_BURST`` at once, then ``INCOMING_RATE`` a second."""
ACCEPTED: Final = frozenset({eio_packet.PONG, eio_packet.MESSAGE, eio_packet.CLOSE})


class ProtocolViolation(eio_exceptions.EngineIOError):  # type: ignore[misc]
    """A client sent what no Engine.IO client sends, or too fast (``flood``): its connection is
    closed."""

    def __init__(self, text: str, *, flood: bool = False) -> None:
        super().__init__(text)
        self.flood = flood


class Flooded(Protocol):
    """What the server is told of a websocket's client past the rate: True when it closes
    the connection itself (with 4011, as every protocol's), False when the seam must."""

    async def __call__(self, eio_sid: str, text: str) -> bool: ...


def decode(data: str | bytes) -> eio_packet.Packet:
    try:
        return eio_packet.Packet(encoded_packet=data)
    except ValueError:  # also a bad base64 payload
        raise ProtocolViolation("a frame that is not an Engine.IO packet") from None


def admit(pkt: eio_packet.Packet, bucket: TokenBucket) -> None:
    """Raise :class:`ProtocolViolation` for a packet no Engine.IO client sends, or one past
    the rate (``bucket``: the client's)."""
    if pkt.packet_type not in ACCEPTED:
        raise ProtocolViolation(f"an Engine.IO packet of type {pkt.packet_type!r}")
    if not isinstance(pkt.data, str | None):
        raise ProtocolViolation("a binary packet (this gateway takes none from clients)")
    if not bucket.take():
        raise ProtocolViolation(
            f"over {INCOMING_RATE:g} packets a second ({INCOMING_BURST:g} at once)", flood=True
        )
