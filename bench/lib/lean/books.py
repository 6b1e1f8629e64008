"""The books the lean clients of a process share: messages outstanding, and every receipt."""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Callable
from typing import Any

EVENT = "bench"
EVENT_BYTES = EVENT.encode()
monotonic_ns = time.monotonic_ns


class Message:
    """One message POSTed and not yet received by every socket it targets."""

    __slots__ = ("ack", "key", "on_done", "position", "remaining", "sent", "seq")

    def __init__(self, seq: int, sent: int, remaining: int, on_done: Callable[[], None]) -> None:
        self.seq = seq
        self.sent = sent  # ns, monotonic, as the body says
        self.remaining = remaining
        self.on_done = on_done
        self.key = b""  # the frame's payload, once a socket has received it
        self.position: str | None = None  # protocol 2: the frame's meta.position
        self.ack = b""  # protocol 2, a receipt asked: the masked ACK frame each socket answers


class Books:
    """The outstanding messages and every receipt, shared by all the clients of this process."""

    def __init__(self) -> None:
        self.pending: dict[int, Message] = {}
        self.frames: dict[bytes, Message] = {}  # payload bytes -> message: one parse per frame
        self.dropped: list[str] = []  # why each client lost its connection without our asking
        self.closing = False  # the bench is closing every socket: not a drop
        self.idle = asyncio.Event()
        self.start_phase()

    def start_phase(self) -> None:
        self.latencies = array("q")  # ns, per delivery
        self.late = 0  # receipts of a message no longer expected (duplicate, or abandoned)
        self.last = 0  # ns, when the last outstanding message was complete
        self.idle.set()

    def expect(self, seq: int, sent: int, count: int, on_done: Callable[[], None]) -> Message:
        message = self.pending[seq] = Message(seq, sent, count, on_done)
        self.idle.clear()
        return message

    def first_receipt(
        self, payload: bytes, body: Any, meta: Any = None, ack: bytes = b""
    ) -> Message | None:
        """The first copy of a frame: its message, from now on found by the frame's bytes;
        ``ack``: the frame each socket that receives it answers (the event asked for an ACK)."""
        seq = body.get("seq") if isinstance(body, dict) else None
        message = self.pending.get(seq) if isinstance(seq, int) else None
        if message is None:
            self.late += 1
            return None
        message.sent = body["t"]
        message.key = payload
        message.ack = ack
        if isinstance(meta, dict):
            message.position = meta.get("position")
        self.frames[payload] = message
        return message

    def finish(self, message: Message, now: int) -> None:
        self.frames.pop(message.key, None)
        if self.pending.pop(message.seq, None) is not None:
            self.last = now
            message.on_done()
        if not self.pending:
            self.idle.set()
