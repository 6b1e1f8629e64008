"""Socket.IO packets as the outbound writes them, encoded once (protocol 1 is Bow's wire;
protocol 2 adds ``meta`` to events, a result to acks and ``info`` to alerts)."""

from __future__ import annotations

from typing import Any, Final

from ..codes import Code
from ..message import Message, dumps

POSITION_EVENT: Final = "__position"
GAP_EVENT: Final = "__gap"


def event(message: Message) -> bytes:
    """A protocol-1 EVENT on ``/``: ``[name]`` or ``[name, payload]``."""
    data = [message.name, message.payload] if message.has_payload else [message.name]
    return b"2" + dumps(data)


def positioned_event(message: Message, position: str, *, replayed: bool = False) -> bytes:
    """A protocol-2 EVENT: always ``[name, payload, meta]``."""
    meta: dict[str, Any] = {"position": position}
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
