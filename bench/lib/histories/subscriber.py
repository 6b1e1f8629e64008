"""A protocol-2 lean client that counts the events of one topic, and asks for replays."""

from __future__ import annotations

import asyncio
import json
import re
from array import array
from typing import Any

from lib import gateway
from lib.lean.books import Books, Message, monotonic_ns
from lib.lean.websocket import LeanClient
from lib.listeners import mint

SEQUENCE = re.compile(rb'"sequence":(\d+)')


class Subscriber(LeanClient):
    """A protocol-2 lean client that counts the events of one topic by ``meta.sequence``.

    Each live event's latency is now minus the ``monotonic_ns`` its payload starts with.
    ``replay()`` sends a ``replay`` and resolves with the ack's result.
    """

    def __init__(self, host: str, token: str, topic: str) -> None:
        super().__init__(Books(), host, token, proto=2, options={})
        self.topic = topic
        self.prefix = b'42["' + topic.encode() + b'","'
        self.offset = len(self.prefix)
        self.seen = bytearray(1 << 16)  # how often each sequence came (saturates at 255)
        self.count = 0  # events of the topic
        self.replayed = 0  # of which replayed
        self.last_replayed = 0  # the sequence of the last replayed event
        self.disorder = 0  # replayed events whose sequence is not the last one's + 1
        self.latencies = array("q")
        self.record = False  # latencies only within the measured window
        self.others: list[bytes] = []  # other events (an alert...)
        self._acks: dict[int, asyncio.Future[Any]] = {}
        self._next_ack = 1

    def _packet(self, opcode: int, payload: bytes) -> Message | None:
        if opcode == 0x1 and payload.startswith(b"43") and self.ready.done():
            digits = payload[2 : payload.index(b"[")]
            waiter = self._acks.pop(int(digits), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(json.loads(payload[2 + len(digits) :])[0])
            return None
        return super()._packet(opcode, payload)

    def _event(self, payload: bytes) -> Message | None:
        if not payload.startswith(self.prefix):
            if not payload.startswith((b'42["__position"', b'42["__gap"')):
                self.others.append(payload[:300])
            return None
        tail = payload.rfind(b'"sequence":')
        match = SEQUENCE.match(payload, tail) if tail >= 0 else None
        if match is None:
            self.others.append(payload[:300])
            return None
        sequence = int(match[1])
        seen = self.seen
        if sequence >= len(seen):
            seen.extend(bytes(max(sequence + 1, 2 * len(seen)) - len(seen)))
        if seen[sequence] < 255:
            seen[sequence] += 1
        self.count += 1
        if payload.endswith(b'"replayed":true}]'):
            self.replayed += 1
            if sequence != self.last_replayed + 1:
                self.disorder += 1
            self.last_replayed = sequence
        elif self.record:
            start = self.offset
            self.latencies.append(monotonic_ns() - int(payload[start : start + 19]))
        return None

    def check(self, last: int) -> tuple[int, int, int]:
        """(sequences 1..last missing, received more than once, received beyond ``last``)."""
        seen = memoryview(self.seen)
        upto = bytes(seen[1 : last + 1]).ljust(last, b"\0")
        missing = upto.count(0)
        duplicated = last - missing - upto.count(1)
        rest = bytes(seen[last + 1 :])
        beyond = len(rest) - rest.count(0)
        return missing, duplicated, beyond

    def replay(self, request: dict[str, Any]) -> asyncio.Future[Any]:
        ack_id, self._next_ack = self._next_ack, self._next_ack + 1
        waiter = self._acks[ack_id] = asyncio.get_running_loop().create_future()
        self._send(b"42%d" % ack_id + json.dumps(["replay", request]).encode())
        return waiter


async def subscribe(port: int, topic: str, listener: str, room: int = 1) -> Subscriber:
    token = mint(listener, gateway.SECRET, {"room": room})
    client = Subscriber(f"127.0.0.1:{port}", token, topic)
    loop = asyncio.get_running_loop()
    await loop.create_connection(lambda: client, "127.0.0.1", port)
    await asyncio.wait_for(client.ready, 30)
    return client
