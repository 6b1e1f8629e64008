"""Socket.IO packets as the outbound writes them, encoded once (protocol 1 is Bow's wire;
protocol 2 adds ``meta`` to events, a result to acks and ``info`` to alerts), and the
:class:`Codec` protocol that delivery frames a message with, once per codec."""

from __future__ import annotations

import abc
from typing import Any, Final, Protocol, TypedDict, Unpack

from ..core.codes import Code
from ..core.message import Message, MessageEvent, dumps
from ..wire.frames import websocket_frame

POSITION_EVENT: Final = "__position"
GAP_EVENT: Final = "__gap"

# What a codec makes of a message at a position, once for all its connections: the packet (as
# queued behind a replay or for a long-polling client) and the bytes written to a transport.
Encoded = tuple[bytes, bytes]


class AlertOptions(TypedDict, total=False):
    """An alert's options, each codec taking those its protocol tells: ``fatal`` (True unless
    given: the connection closes after it), ``reconnect`` (protocol 2's advice), ``session``
    (the connection's, where the protocol addresses alerts to it)."""

    fatal: bool
    reconnect: str | None
    session: str | None


class Codec(Protocol):
    """How one wire protocol frames what the core writes: a message at a position (once per
    message, whatever the number of connections), alerts, ``__gap`` and ``__position``."""

    name: str  # one per encoding (what delivery caches a message's bytes under)
    protocol: str  # the wire protocol, as metrics label it: socketio, sse, flywheel
    positioned: bool  # its connections are told positions (recovery, __gap, __position)
    reauthenticates: bool  # its clients can authenticate again (4100 before 4003 at expiry)
    coded: bool  # its clients are told the codes of section 10 (all but Bow's protocol 1)
    acknowledges: bool  # its clients acknowledge a message that asked for a receipt (17)

    def message(self, event: MessageEvent, position: str, ack_id: int = 0) -> Encoded:
        """A delivered message: its packet and the exact bytes written to a transport;
        ``ack_id`` (not 0): the client is asked to acknowledge it under that id (only where it
        ``acknowledges``)."""
        ...

    def replayed(self, event: MessageEvent, position: str) -> bytes:
        """A message replayed (by a recovery, or from its topic's history), as a packet."""
        ...

    def frame(self, packet: bytes) -> bytes:
        """The bytes written to a transport for one packet."""
        ...

    def alert(self, code: Code, text: str, **options: Unpack[AlertOptions]) -> bytes:
        """An alert packet: ``code`` and why, with :class:`AlertOptions`."""
        ...

    def gateway_event(self, name: str, meta: dict[str, Any]) -> bytes:
        """``__gap`` or ``__position`` as a packet."""
        ...


class SocketIO:
    """Socket.IO EVENTs on ``/``, written to a websocket as Engine.IO MESSAGE frames."""

    __slots__ = (
        "acknowledges",
        "coded",
        "name",
        "positioned",
        "proto",
        "protocol",
        "reauthenticates",
    )

    def __init__(self, proto: int) -> None:
        self.proto = proto
        self.protocol = "socketio"
        self.name = f"socketio{proto}"
        self.positioned = self.reauthenticates = self.coded = self.acknowledges = proto == 2

    def message(self, event: MessageEvent, position: str, ack_id: int = 0) -> Encoded:
        if self.positioned:
            packet = positioned_event(
                event.message, position, sequence=event.sequence, message_id=event.id
            )
            if ack_id:  # an EVENT with an id asks the client for an ACK: 2<id>[...]
                packet = b"2%d%s" % (ack_id, packet[1:])
        else:
            packet = plain_event(event.message)
        return packet, websocket_frame(b"4" + packet)

    def replayed(self, event: MessageEvent, position: str) -> bytes:
        return positioned_event(
            event.message, position, replayed=True, sequence=event.sequence, message_id=event.id
        )

    def frame(self, packet: bytes) -> bytes:
        return websocket_frame(b"4" + packet)  # an Engine.IO MESSAGE

    def alert(self, code: Code, text: str, **options: Unpack[AlertOptions]) -> bytes:
        fatal, reconnect = options.get("fatal", True), options.get("reconnect")
        return alert(self.proto, code, text, fatal=fatal, reconnect=reconnect)

    def gateway_event(self, name: str, meta: dict[str, Any]) -> bytes:
        return gateway_event(name, meta)


class FramedCodec(abc.ABC):
    """The codec of a protocol served on a plain WebSocket (Flywheel, Gobbler): its packets are
    whole frames, no positions, and a fatal alert is the close frame its endpoint sends with
    the code (``Connection.farewell``). Subclasses frame a message and a non-fatal notice."""

    __slots__ = ("acknowledges", "coded", "name", "positioned", "protocol", "reauthenticates")

    def __init__(self, protocol: str, *, reauthenticates: bool) -> None:
        self.name = self.protocol = protocol
        self.positioned = self.acknowledges = False
        self.reauthenticates = reauthenticates
        self.coded = True

    def message(self, event: MessageEvent, position: str, ack_id: int = 0) -> Encoded:
        frame = self.replayed(event, position)
        return frame, frame

    @abc.abstractmethod
    def replayed(self, event: MessageEvent, position: str) -> bytes:
        """One message as a whole frame."""

    def frame(self, packet: bytes) -> bytes:
        return packet

    def alert(self, code: Code, text: str, **options: Unpack[AlertOptions]) -> bytes:
        if options.get("fatal", True):
            return b""
        return self.notice(code, text, options.get("session"))

    @abc.abstractmethod
    def notice(self, code: Code, text: str, session: str | None) -> bytes:
        """A non-fatal alert (4100), in the protocol's own words."""

    def gateway_event(self, name: str, meta: dict[str, Any]) -> bytes:
        return b""  # no positions in these protocols


def text_body(message: Message) -> bytes:
    """A message's body as text protocols carry it: a string as it is, another payload as its
    JSON, nothing without a payload."""
    payload = message.payload
    if isinstance(payload, str):
        return payload.encode()
    return dumps(payload) if message.has_payload else b""


PROTOCOL_1: Final = SocketIO(1)
PROTOCOL_2: Final = SocketIO(2)


def socketio_codec(proto: int) -> SocketIO:
    return PROTOCOL_2 if proto == 2 else PROTOCOL_1


def plain_event(message: Message) -> bytes:
    """A protocol-1 EVENT on ``/``: ``[name]`` or ``[name, payload]``."""
    data = [message.name, message.payload] if message.has_payload else [message.name]
    return b"2" + dumps(data)


def positioned_event(
    message: Message,
    position: str,
    *,
    replayed: bool = False,
    sequence: int | None = None,
    message_id: str = "",
) -> bytes:
    """A protocol-2 EVENT: always ``[name, payload, meta]``, ``meta`` ``{"position", "id"}``
    (section 16: a client drops a message replayed twice by its id); ``meta.sequence`` for a
    message kept in its topic's history. A topic replay's events have no position (``""``): the
    client's recovery point must not move back."""
    meta: dict[str, Any] = {"position": position} if position else {}
    if message_id:
        meta["id"] = message_id
    if sequence is not None:
        meta["sequence"] = sequence
    if replayed:
        meta["replayed"] = True
    return b"2" + dumps([message.name, message.payload, meta])


def gateway_event(name: str, meta: dict[str, Any]) -> bytes:
    """``__position`` or ``__gap``: ``(null, meta)``."""
    return b"2" + dumps([name, None, meta])


def alert(
    proto: int, code: Code, text: str, *, fatal: bool = True, reconnect: str | None = None
) -> bytes:
    """``alert``: ``(text)`` whose text starts with the reason (protocol 1), ``(text, info)``."""
    if proto == 1:
        return b"2" + dumps(["alert", f"{code.reason}: {text}"])
    return b"2" + dumps(["alert", text, code.info(fatal=fatal, reconnect=reconnect)])


def ack(ack_id: int, result: Any = None, *, proto: int = 1) -> bytes:
    """An ACK on ``/``: empty for protocol 1, the result object for protocol 2."""
    return b"3" + str(ack_id).encode() + (dumps([result]) if proto == 2 else b"[]")
