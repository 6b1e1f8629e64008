"""Fan-out benchmark: L lean websocket clients, audiences of 1 listener, 10% and 100%.

Run:  .venv/bin/python bench/fanout_bench.py [--sockets 1000,10000] [--duration 30] [--redis]
      .venv/bin/python bench/fanout_bench.py --sockets 1000 --duration 5 --short-duration 3

A plain script, not a test. For every L in ``--sockets`` it starts a fresh gateway
(``_gateway.py``: JWT outbound v1.3, claims middleware, pass-through inbound on /v1.2/messages,
the in-process backplane, or with ``--redis`` the Redis backplane on a private redis-server),
pinned to CPU 0 with ``taskset``; this process, the load generator, pins itself (and the
redis-server) to CPU 1. It opens L websocket connections with a Socket.IO client of its own,
written on asyncio Protocols (no python-socketio: this one costs a few µs per received frame):
HTTP upgrade to ``/socket.io/?EIO=4&transport=websocket&v=v1.3``, Engine.IO OPEN, Socket.IO
CONNECT ``40``, ``420["authenticate", <JWT>]`` and its ack ``430[]``; it answers pings and masks
its frames. ``--protocol`` picks other clients, as lean, for the same gateway and audiences:
``flywheel`` (a plain websocket on ``/broker?v=v1.3``: ``B {"auth": {"type": "Bearer", "token":
<JWT>}, "subscribe": ["bench"]}``, then ``R bench {body}`` frames) and ``sse`` (``GET
/events?v=v1.3`` over raw HTTP/1.1 with ``Authorization: Bearer <JWT>``, then the chunked
``text/event-stream``, one event a chunk); ``--protocol socketio,flywheel,sse --rounds 3`` runs
them interleaved and prints each one's CPU per delivery against Socket.IO's, round by round.
Listener i has the criteria ``{"all": true, "g10": i % 10 == 0, "role": ...}`` as in
``delivery_bench.py``. Then these phases, POSTed to the inbound over keep-alive connections:

- light load (one message in flight: the next is POSTed once every recipient has the last):
  ``[{"__id": <random>}]`` (1 listener), ``[{"g10": true}]`` (10%), ``[{"all": true}]`` (100%);
- saturation (back to back, at most ``--window`` messages outstanding, i.e. not yet received by
  every recipient; ``--window-one`` for 1 listener): the same three audiences, for
  ``--short-duration`` s (1 listener, 10%) and ``--duration`` s (100%).

Every message body carries its sequence number and ``time.monotonic_ns()`` taken just before its
POST; all recipients receive identical bytes, so each distinct frame is parsed once (a dict keyed
by the frame's bytes) and every receipt costs a dict look-up and an ``array.append`` of its
latency (POST start to the client's ``data_received``, per delivery; CLOCK_MONOTONIC is
system-wide). Per phase: deliveries/s (first POST to last receipt), p50/p99, the gateway's CPU
per delivery and per message (utime + stime from /proc/<pid>/stat, 10 ms ticks), the load
generator's own CPU (when it nears 100% it, not the gateway, is the bottleneck), sockets dropped
(seen closing by the clients; disconnects counted by the gateway's metrics), and the gateway's
longest event-loop stall (``_gateway.py``'s ``stall`` probe: a 10 ms timer's worst lateness) and
longest garbage collection; and how busy each of the two cores was (/proc/stat, softirq included).
Before the phases: the connect+authenticate rate and the gateway's RSS per connection (idle,
before and after connecting); after them, every socket is closed at once from the client side,
and the time the gateway takes to count them disconnected (and its stall meanwhile) is printed.
For L = 10,000 it checks the target of the issue: 100% audience,
30 s back to back, no socket dropped, longest stall under 100 ms, p99 under 1 s. The exit status
is 1 when a socket was dropped (or could not connect).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gc
import hashlib
import json
import os
import random
import re
import resource
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as common
import _gateway as gateway
import aiohttp
import redis_bench
from _redis import RedisServer
from bow_gateway.outbounds.jwt import mint

EVENT = "bench"
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
SOCKET_PATH = f"/socket.io/?EIO=4&transport=websocket&v={gateway.OUTBOUND_VERSION}"
FLYWHEEL_PATH = f"/broker?v={gateway.OUTBOUND_VERSION}"
SSE_PATH = f"/events?v={gateway.OUTBOUND_VERSION}"
PROTOCOLS = ("socketio", "flywheel", "sse")  # what --protocol takes
EVENT_BYTES = EVENT.encode()
TARGET_SOCKETS, TARGET_STALL, TARGET_P99 = 10_000, 0.100, 1e9  # the 100% target (s, ns)
monotonic_ns = time.monotonic_ns


# -- receipts ---------------------------------------------------------------------------------


class Message:
    """One message POSTed and not yet received by every socket it targets."""

    __slots__ = ("key", "on_done", "position", "remaining", "sent", "seq")

    def __init__(self, seq: int, sent: int, remaining: int, on_done: Callable[[], None]) -> None:
        self.seq = seq
        self.sent = sent  # ns, monotonic, as the body says
        self.remaining = remaining
        self.on_done = on_done
        self.key = b""  # the frame's payload, once a socket has received it
        self.position: str | None = None  # protocol 2: the frame's meta.position


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

    def first_receipt(self, payload: bytes, body: Any, meta: Any = None) -> Message | None:
        """The first copy of a frame: its message, from now on found by the frame's bytes."""
        seq = body.get("seq") if isinstance(body, dict) else None
        message = self.pending.get(seq) if isinstance(seq, int) else None
        if message is None:
            self.late += 1
            return None
        message.sent = body["t"]
        message.key = payload
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


# -- the lean Socket.IO client ----------------------------------------------------------------


def client_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    """A final WebSocket frame, masked as every client frame must be (RFC 6455 section 5.3)."""
    length = len(payload)
    if length < 126:
        header = bytes((0x80 | opcode, 0x80 | length))
    elif length < 65_536:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
    key = os.urandom(4)
    mask = int.from_bytes((key * (length // 4 + 1))[:length], "big")
    return header + key + (int.from_bytes(payload, "big") ^ mask).to_bytes(length, "big")


def socket_path(proto: int) -> str:
    """The handshake's path: protocol 2 opts in with ``proto=2`` next to ``v``."""
    return SOCKET_PATH + ("&proto=2" if proto == 2 else "")


class LeanClient(asyncio.Protocol):
    """One Socket.IO connection over a websocket: handshake, authentication, then counting.

    ``ready`` is done once the gateway has acknowledged ``authenticate``. Every event frame of
    the benchmark found in ``books.frames`` costs a dict look-up, an ``array.append`` and two
    decrements; anything else (handshake, pings, a first copy) goes through ``_packet``.

    ``proto=2`` opts in to protocol 2 (``&proto=2``) and authenticates with
    ``(token, options, ack)`` (``options``: ``{}``, or ``{"since": position}`` to recover); the
    ack's result object is kept in ``result``, and ``position`` is the last position received
    (an event's ``meta.position``, ``__position``, ``__gap`` or the ack's).
    """

    def __init__(
        self,
        books: Books,
        host: str,
        token: str,
        proto: int = 1,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.books = books
        self.host = host
        self.token = token
        self.proto = proto
        self.options = options if options is not None else {}
        self.result: Any = None  # protocol 2: the ack's result object
        self.position: str | None = None  # protocol 2: the last position received
        self.gaps: list[Any] = []  # protocol 2: the meta of every __gap
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.received = 0  # event frames of the benchmark
        self.reason = ""  # why the gateway closed this socket, if it said
        self.lost = False
        self._accept = b""
        self._upgraded = False
        self._buffer = b""

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        key = base64.b64encode(os.urandom(16))
        self._accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
        transport.write(
            f"GET {self._path()} HTTP/1.1\r\nHost: {self.host}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n".encode()
            + b"Sec-WebSocket-Key: "
            + key
            + b"\r\n\r\n"
        )

    def _path(self) -> str:
        return socket_path(self.proto)

    def data_received(self, data: bytes) -> None:
        if self._buffer:
            data = self._buffer + data
            self._buffer = b""
        if not self._upgraded:
            data = self._upgrade(data)
        if data:
            rest = self._frames(data)
            if rest:
                self._buffer = rest

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        reason = self.reason or (f"{type(exc).__name__}: {exc}" if exc else "closed by the peer")
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(reason))
        elif not self.books.closing:
            self.books.dropped.append(reason)

    # the hot path

    def _frames(self, data: bytes) -> bytes:
        """Handle every whole frame of ``data``; return what is left of a partial one."""
        now = monotonic_ns()
        books = self.books
        frames = books.frames
        latencies = books.latencies
        pos, end = 0, len(data)
        while end - pos >= 2:
            length = data[pos + 1]  # a server's frames are not masked
            if length < 126:
                start = pos + 2
            elif length == 126:
                if end - pos < 4:
                    break
                length = (data[pos + 2] << 8) | data[pos + 3]
                start = pos + 4
            else:
                if end - pos < 10:
                    break
                length = int.from_bytes(data[pos + 2 : pos + 10], "big")
                start = pos + 10
            stop = start + length
            if stop > end:
                break
            payload = data[start:stop]
            message = frames.get(payload)
            if message is None:
                message = self._packet(data[pos] & 0x0F, payload)
            if message is not None:
                latencies.append(now - message.sent)
                self.received += 1
                self.position = message.position
                message.remaining -= 1
                if message.remaining == 0:
                    books.finish(message, now)
            pos = stop
        return data[pos:]

    # everything else

    def _packet(self, opcode: int, payload: bytes) -> Message | None:
        """A frame not seen before: returns its message if it is the first copy of one."""
        if opcode == 0x1:
            if payload == b"2":  # Engine.IO PING
                self._send(b"3")
            elif payload.startswith(b"42"):
                return self._event(payload)
            elif payload.startswith(b"43"):  # the ack of authenticate
                if not self.ready.done():
                    self._acknowledged(payload)
                    self.ready.set_result(None)
            elif payload.startswith(b"40"):  # connected to "/"
                arguments = ["authenticate", self.token]
                if self.proto == 2:
                    arguments.append(self.options)
                self._send(b"420" + json.dumps(arguments).encode())
            elif payload.startswith(b"0"):  # Engine.IO OPEN
                self._send(b"40")
            elif payload.startswith((b"44", b"41", b"1")):
                self.reason = self.reason or f"Socket.IO/Engine.IO {payload[:200]!r}"
        elif opcode == 0x8:  # close
            self.reason = self.reason or f"websocket close {payload[:2].hex()}"
            self._send(payload[:2], 0x8)
            if self.transport is not None:
                self.transport.close()
        elif opcode == 0x9:  # websocket ping
            self._send(payload, 0xA)
        return None

    def _acknowledged(self, payload: bytes) -> None:
        """``430[]`` (protocol 1) or ``430[{result}]`` (protocol 2)."""
        if self.proto != 2:
            return
        try:
            self.result = json.loads(payload[payload.index(b"[") :])[0]
        except (ValueError, IndexError):
            self.result = None
        if isinstance(self.result, dict):
            self.position = self.result.get("position") or self.position

    def _event(self, payload: bytes) -> Message | None:
        try:
            name, *args = json.loads(payload[2:])
        except ValueError:
            return None
        meta = args[1] if self.proto == 2 and len(args) > 1 else None
        if name == "__position" or name == "__gap":  # protocol 2's gateway events
            if isinstance(meta, dict) and meta.get("position"):
                self.position = meta["position"]
            if name == "__gap":
                self.gaps.append(meta)
            return None
        if name != EVENT:  # e.g. "alert": why the gateway is about to close this socket
            self.reason = f"{name}: {args}"
            return None
        return self.books.first_receipt(payload, args[0] if args else None, meta)

    def _upgrade(self, data: bytes) -> bytes:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            self._buffer = data
            return b""
        head = data[:end]
        if not head.startswith(b"HTTP/1.1 101") or self._accept not in head:
            self.reason = f"websocket upgrade refused: {head[:200]!r}"
            if self.transport is not None:
                self.transport.close()
            return b""
        self._upgraded = True
        return data[end + 4 :]

    def _send(self, payload: bytes, opcode: int = 0x1) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(client_frame(payload, opcode))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class FlywheelClient(LeanClient):
    """One Flywheel connection (``docs/flywheel.md``) over a plain websocket, lean as
    :class:`LeanClient`: upgrade on ``/broker?v=...``, ``B {"auth": {"type": "Bearer", "token"},
    "subscribe": [...]}``, ready at a ``BindResponse`` without errors, then every ``R {topic}
    {body}`` frame of the benchmark counted as Socket.IO's events are (the first copy of a frame
    is parsed, the others found by their bytes). It answers the gateway's websocket pings."""

    def __init__(
        self, books: Books, host: str, token: str, subscribe: Sequence[str] = (EVENT,)
    ) -> None:
        super().__init__(books, host, token, proto=2)
        self.subscribe = list(subscribe)
        self._bound = False

    def _path(self) -> str:
        return FLYWHEEL_PATH

    def _upgrade(self, data: bytes) -> bytes:
        rest = super()._upgrade(data)
        if self._upgraded and not self._bound:
            self._bound = True
            bind = {"auth": {"type": "Bearer", "token": self.token}, "subscribe": self.subscribe}
            self._send(b"B " + json.dumps(bind).encode())
        return rest

    def _packet(self, opcode: int, payload: bytes) -> Message | None:
        if opcode != 0x1:  # close, ping: as any websocket
            return super()._packet(opcode, payload)
        if payload.startswith(b"R "):
            topic, _, body = payload[2:].partition(b" ")
            if topic == EVENT_BYTES:
                try:
                    return self.books.first_receipt(payload, json.loads(body))
                except ValueError:
                    return None
            self.reason = f"Flywheel {payload[:200]!r}"  # $remote/.../rx/alerts or errors
        elif payload.startswith(b"B "):
            try:
                errors = json.loads(payload[2:]).get("errors")
            except (ValueError, AttributeError):
                errors = [f"not a BindResponse: {payload[:200]!r}"]
            if errors:
                self.reason = f"bind refused: {errors}"
            elif not self.ready.done():
                self.ready.set_result(None)
        else:
            self.reason = f"Flywheel {payload[:200]!r}"
        return None


class SseClient(LeanClient):
    """One Server-Sent Events stream (``docs/sse.md``) over raw HTTP/1.1: ``GET /events?v=...``
    with ``Authorization: Bearer``, ready at the ``200`` (the gateway holds the stream as a
    listener before it answers), then the chunked body read chunk by chunk. The gateway frames
    each event as one HTTP/1.1 chunk, the same bytes for every stream: a chunk seen before costs
    a dict look-up, as a websocket frame does; a new one is parsed into its ``id:``, ``event:``
    and ``data:`` fields (comments, the ``id:``-only positions and ``alert`` included)."""

    def __init__(self, books: Books, host: str, token: str) -> None:
        super().__init__(books, host, token, proto=2)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(
            f"GET {SSE_PATH} HTTP/1.1\r\nHost: {self.host}\r\nAccept: text/event-stream\r\n"
            f"Authorization: Bearer {self.token}\r\n\r\n".encode()
        )

    def data_received(self, data: bytes) -> None:
        if self._buffer:
            data = self._buffer + data
            self._buffer = b""
        if not self._upgraded:
            data = self._response(data)
        if data:
            rest = self._chunks(data)
            if rest:
                self._buffer = rest

    def _response(self, data: bytes) -> bytes:
        """The status line and headers: a ``200`` with a chunked ``text/event-stream``."""
        end = data.find(b"\r\n\r\n")
        if end < 0:
            self._buffer = data
            return b""
        head = data[:end].lower()
        if not head.startswith(b"http/1.1 200") or b"transfer-encoding: chunked" not in head:
            self.reason = f"SSE stream refused: {data[: end + 200]!r}"  # 503: retried
            if self.transport is not None:
                self.transport.close()
            return b""
        self._upgraded = True
        if not self.ready.done():
            self.ready.set_result(None)
        return data[end + 4 :]

    def _chunks(self, data: bytes) -> bytes:
        """Handle every whole chunk of ``data``; return what is left of a partial one."""
        now = monotonic_ns()
        books = self.books
        frames = books.frames
        latencies = books.latencies
        pos, end = 0, len(data)
        while True:
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                break
            start = eol + 2
            stop = start + int(data[pos:eol], 16)  # no chunk extensions from aiohttp
            if stop + 2 > end:
                break
            if stop == start:  # the last chunk: the gateway ended the stream
                self.reason = self.reason or "the stream ended"
                pos = end
                break
            payload = data[start:stop]
            message = frames.get(payload)
            if message is None:
                message = self._events(payload)
            if message is not None:
                latencies.append(now - message.sent)
                self.received += 1
                self.position = message.position
                message.remaining -= 1
                if message.remaining == 0:
                    books.finish(message, now)
            pos = stop + 2
        return data[pos:]

    def _events(self, payload: bytes) -> Message | None:
        """A chunk not seen before: its events (the gateway writes one per chunk); the message
        of the first event of the benchmark in it, if it is the first copy of one."""
        found = None
        for block in payload.split(b"\n\n"):
            fields: dict[bytes, bytes] = {}
            for line in block.split(b"\n"):
                if not line or line.startswith(b":"):  # a comment: the heartbeat
                    continue
                name, _, value = line.partition(b":")
                value = value[1:] if value.startswith(b" ") else value
                if name == b"data" and b"data" in fields:
                    value = fields[b"data"] + b"\n" + value
                fields[name] = value
            if b"id" in fields:
                self.position = fields[b"id"].decode()
            event = fields.get(b"event", b"message")
            if b"data" not in fields:
                continue  # not dispatched (an id alone: __position)
            if event == EVENT_BYTES and found is None:
                try:
                    body = json.loads(fields[b"data"])
                except ValueError:
                    continue
                found = self.books.first_receipt(payload, body)
                if found is not None:
                    found.position = self.position
            elif event == b"__gap":
                self.gaps.append(fields[b"data"])
            elif event != EVENT_BYTES:  # alert: the gateway ends the stream next
                self.reason = f"SSE {event.decode()}: {fields[b'data'][:200]!r}"
        return found


def make_client(protocol: str, books: Books, host: str, token: str, proto: int) -> LeanClient:
    """A lean client of ``protocol`` (``socketio`` speaks Socket.IO protocol ``proto``)."""
    if protocol == "flywheel":
        return FlywheelClient(books, host, token)
    if protocol == "sse":
        return SseClient(books, host, token)
    return LeanClient(books, host, token, proto)


async def open_clients(
    books: Books,
    host: str,
    port: int,
    n: int,
    concurrency: int,
    proto: int = 1,
    retries: int = 30,
    protocol: str = "socketio",
) -> tuple[list[LeanClient], list[str]]:
    """Connect and authenticate listeners 0..n-1, ``concurrency`` handshakes at a time."""
    loop = asyncio.get_running_loop()
    semaphore = asyncio.Semaphore(concurrency)
    clients: list[LeanClient] = []
    failures: list[str] = []
    refused = [0]  # handshakes answered 503 (the gateway's connection-rate limit), then retried
    tokens = [
        mint(redis_bench.listener_id(i), gateway.SECRET, criteria=redis_bench.criteria(i))
        for i in range(n)
    ]

    async def open_one(i: int) -> None:
        for attempt in range(retries + 1):
            client = make_client(protocol, books, f"{host}:{port}", tokens[i], proto)
            async with semaphore:
                try:
                    await loop.create_connection(lambda c=client: c, host, port)
                    await asyncio.wait_for(client.ready, 60)
                except (OSError, TimeoutError) as error:  # ConnectionError is an OSError
                    client.close()
                    if b"503 Service Unavailable" in client.reason.encode() and attempt < retries:
                        refused[0] += 1  # over outbound.max_connects_per_second: as advised
                    else:
                        failures.append(f"{type(error).__name__}: {error}")
                        return
                else:
                    clients.append(client)
                    return
            await asyncio.sleep(1.0 + random.random())  # Retry-After: 1, jittered

    await asyncio.gather(*(open_one(i) for i in range(n)))
    if refused[0]:
        print(
            f"  {refused[0]:,} handshakes were refused 503 (over the gateway's "
            "outbound.max_connects_per_second) and retried after 1-2 s, as Retry-After says",
            flush=True,
        )
    return clients, failures


# -- the lean HTTP client of the inbound ------------------------------------------------------

CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


class Poster(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to the inbound: one POST at a time, its status back."""

    def __init__(self, host: str, authorization: str) -> None:
        self._head = (
            f"POST {gateway.PATH} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {authorization}\r\n"
            "Content-Type: application/json\r\nContent-Length: "
        ).encode()
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[int] | None = None
        self._buffer = b""
        self.head = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        length = CONTENT_LENGTH.search(self._buffer, 0, end + 2)
        stop = end + 4 + (int(length.group(1)) if length else 0)
        if len(self._buffer) < stop:
            return
        status = int(self._buffer[9:12])
        self.head = self._buffer[:end]  # the last answer's status line and headers
        self._buffer = self._buffer[stop:]
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError(f"the inbound closed: {exc}"))

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    async def post(self, body: bytes) -> int:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(self._head + b"%d\r\n\r\n" % len(body) + body)
        return await self._waiter


class Posters:
    """A pool of :class:`Poster` connections, reopened when the gateway has closed one."""

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._authorization = aiohttp.encode_basic_auth(gateway.USER, gateway.PASSWORD)
        self._free: asyncio.Queue[Poster | None] = asyncio.Queue()

    def grow(self, size: int) -> None:
        for _ in range(size - self._free.qsize()):
            self._free.put_nowait(None)  # opened on first use

    async def post(self, body: bytes) -> int:
        poster = await self._free.get()
        try:
            if poster is None or not poster.usable:
                poster = Poster(f"{self._host}:{self._port}", self._authorization)
                loop = asyncio.get_running_loop()
                await loop.create_connection(lambda: poster, self._host, self._port)
            return await poster.post(body)
        finally:
            self._free.put_nowait(poster)


# -- phases -----------------------------------------------------------------------------------


def cpu_busy() -> dict[int, tuple[float, float]]:
    """Per CPU: (seconds not idle, of which in softirq), from /proc/stat: whether a core was
    saturated, whoever used it (softirq: mostly the kernel's loopback TCP work)."""
    result = {}
    with open("/proc/stat", encoding="ascii") as stat:
        for row in stat:
            name, *fields = row.split()
            if name.startswith("cpu") and name != "cpu":
                ticks = [int(v) for v in fields[:8]]
                busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
                result[int(name[3:])] = (busy / common.CLOCK_TICKS, ticks[6] / common.CLOCK_TICKS)
    return result


def cpu_delta(
    before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]]
) -> dict[int, tuple[float, float]]:
    return {cpu: (a[0] - before[cpu][0], a[1] - before[cpu][1]) for cpu, a in after.items()}


@dataclass
class Phase:
    name: str
    audience: Callable[[], bytes]  # a new message's audience, as JSON
    expected: int  # sockets each message targets
    window: int
    duration: float | None = None  # seconds of sending, or
    count: int | None = None  # messages


@dataclass
class Result:
    phase: Phase
    messages: int
    expected: int
    latencies: array[int]
    post_times: array[int]
    wall: float  # s, first POST to last receipt
    cpu: dict[str, Any]  # Machine.delta: gateways, redis, loadgen, other (s)
    stall: float  # s, the gateway's longest event-loop stall
    gc_longest: float  # s, the gateway's longest garbage collection
    cores: list[tuple[float, float]]  # the gateway's core, the load generator's: (busy, softirq) s
    dropped: int  # sockets that saw their connection close
    gateway_drops: dict[str, float]  # disconnects the gateway counted, by reason
    late: int
    errors: int  # POSTs not answered 204, and messages given up on

    @property
    def deliveries(self) -> int:
        return len(self.latencies)

    @property
    def gateway_cpu(self) -> float:
        return float(sum(self.cpu["gateways"]))

    def rate_text(self) -> str:
        return f"{self.deliveries / self.wall:,.0f}/s" if self.wall > 0 else "-"


@dataclass
class Run:
    """One L: the gateway, its clients, and what they cost."""

    sockets: int
    gateways: redis_bench.Gateways
    port: int
    machine: redis_bench.Machine
    books: Books
    posters: Posters
    cores: tuple[int, int]  # CPUs of the gateway and of the load generator
    proto: int = 1  # the clients' Socket.IO protocol
    protocol: str = "socketio"  # the clients' wire protocol: socketio, flywheel or sse
    clients: list[LeanClient] = field(default_factory=list)
    spy: str = ""  # py-spy each phase into "{spy}-{phase}.txt" (raw collapsed stacks), if set
    spy_rate: int = 250
    seq: int = 0  # global: a frame is never mistaken for one of an earlier phase

    async def gateway(self, command: str) -> dict[str, Any]:
        return (await self.gateways.command(command))[0]


def disconnects(answer: dict[str, Any]) -> dict[str, float]:
    return dict(answer["sockets"]["disconnects"])


async def run_phase(run: Run, phase: Phase, drain: float) -> Result:
    books = run.books
    books.start_phase()
    window = asyncio.Semaphore(phase.window)
    run.posters.grow(phase.window * 2)  # a 204 may come after the last receipt of its message
    post_times = array("q")
    tasks: set[asyncio.Task[None]] = set()
    errors = 0

    async def post(message: Message, audience: bytes) -> None:
        nonlocal errors
        body = b'{"name":"%s","audience":%s,"seq":%d,"t":%d}' % (
            EVENT.encode(),
            audience,
            message.seq,
            message.sent,
        )
        try:
            status = await run.posters.post(body)
        except OSError:
            status = 0
        post_times.append(monotonic_ns() - message.sent)
        if status != 204:
            errors += 1
            books.finish(message, books.last)

    gateway_before = disconnects(await run.gateway("sockets"))
    dropped_before = len(books.dropped)
    spy = None
    if run.spy and phase.name in PHASE_KEYS:
        spy = start_spy(run, f"{run.spy}-{PHASE_KEYS[phase.name]}.txt")
        await asyncio.sleep(1.0)  # py-spy attaches
    await run.gateway("stall")
    await run.gateway("gc")
    cpus_before = cpu_busy()
    before = run.machine.snapshot()
    started = monotonic_ns()
    deadline = started + int((phase.duration or 0) * 1e9)
    sent = 0
    while (phase.count is not None and sent < phase.count) or (
        phase.duration is not None and monotonic_ns() < deadline
    ):
        try:
            await asyncio.wait_for(window.acquire(), drain)
        except TimeoutError:  # a message some socket never received: give up on it
            errors += 1
            if books.pending:
                books.finish(books.pending[min(books.pending)], books.last)
            await window.acquire()
        run.seq += 1
        sent += 1
        message = books.expect(run.seq, monotonic_ns(), phase.expected, window.release)
        task = asyncio.create_task(post(message, phase.audience()))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(books.idle.wait(), drain)
    if tasks:
        await asyncio.gather(*tasks)
    after = run.machine.snapshot()
    cpus = cpu_delta(cpus_before, cpu_busy())
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
        await asyncio.to_thread(spy.wait, 60)
    cores = [cpus.get(cpu, (0.0, 0.0)) for cpu in run.cores]
    stall = (await run.gateway("stall"))["stall"]["longest"]
    gc_longest = max((await run.gateway("gc"))["gc"]["longest"])
    gateway_after = disconnects(await run.gateway("sockets"))
    errors += len(books.pending)
    for message in list(books.pending.values()):  # never complete: forget them
        books.finish(message, books.last)
    return Result(
        phase=phase,
        messages=sent,
        expected=sent * phase.expected,
        latencies=books.latencies,
        post_times=post_times,
        wall=((books.last or monotonic_ns()) - started) / 1e9,
        cpu=redis_bench.Machine.delta(before, after),
        stall=stall,
        gc_longest=gc_longest,
        cores=cores,
        dropped=len(books.dropped) - dropped_before,
        gateway_drops={
            reason: count - gateway_before.get(reason, 0)
            for reason, count in gateway_after.items()
            if count > gateway_before.get(reason, 0)
        },
        late=books.late,
        errors=errors,
    )


def start_spy(run: Run, path: str) -> subprocess.Popen[bytes]:
    """``py-spy record`` of the gateway (it must be in this Python's bin directory); it pauses
    the gateway at each sample: the CPU figures of a phase profiled are inflated."""
    command = [str(Path(sys.executable).parent / "py-spy"), "record", "-p"]
    command += [str(run.gateways.pids[0]), "-r", str(run.spy_rate), "-f", "raw", "-o", path]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def phases(args: argparse.Namespace, n: int, rng: random.Random) -> list[Phase]:
    in_group = sum(1 for i in range(n) if redis_bench.criteria(i)["g10"])

    def one() -> bytes:
        return b'[{"__id":"%s"}]' % redis_bench.listener_id(rng.randrange(n)).encode()

    def group() -> bytes:
        return b'[{"g10":true}]'

    def everyone() -> bytes:
        return b'[{"all":true}]'

    short, long = args.short_duration, args.duration
    return [
        Phase("light, 1 listener", one, 1, 1, count=args.light_one),
        Phase("light, 10%", group, in_group, 1, count=args.light_group),
        Phase("light, 100%", everyone, n, 1, count=args.light_all),
        Phase("saturation, 1 listener", one, 1, args.window_one, duration=short),
        Phase("saturation, 10%", group, in_group, args.window, duration=short),
        Phase("saturation, 100%", everyone, n, args.window, duration=long),
    ]


PHASE_KEYS = {
    "light, 1 listener": "light-1",
    "light, 10%": "light-10",
    "light, 100%": "light-100",
    "saturation, 1 listener": "sat-1",
    "saturation, 10%": "sat-10",
    "saturation, 100%": "sat-100",
}


# -- one L ------------------------------------------------------------------------------------


@dataclass
class Connected:
    sockets: int
    opened: int
    failures: list[str]
    wall: float
    gateway_cpu: float
    loadgen_cpu: float
    rss_before_kib: int
    rss_after_kib: int
    gateway_counts: dict[str, Any]  # what the gateway's metrics say once connected

    @property
    def rate(self) -> float:
        return self.opened / self.wall if self.wall > 0 else float("nan")

    @property
    def rss_per_socket_kib(self) -> float:
        return (self.rss_after_kib - self.rss_before_kib) / max(self.opened, 1)


async def connect(run: Run, args: argparse.Namespace) -> Connected:
    pid = run.gateways.pids[0]
    await asyncio.sleep(args.idle)
    rss_before = common.rss_kib(pid)["VmRSS"]
    before = run.machine.snapshot()
    started = time.perf_counter()
    run.clients, failures = await open_clients(
        run.books,
        args.host,
        run.port,
        run.sockets,
        args.connect_concurrency,
        run.proto,
        protocol=run.protocol,
    )
    wall = time.perf_counter() - started
    used = redis_bench.Machine.delta(before, run.machine.snapshot())
    gc.collect()
    gc.freeze()  # this process's full collections stay out of the latencies
    await asyncio.sleep(args.idle)
    return Connected(
        sockets=run.sockets,
        opened=len(run.clients),
        failures=failures,
        wall=wall,
        gateway_cpu=float(sum(used["gateways"])),
        loadgen_cpu=used["loadgen"],
        rss_before_kib=rss_before,
        rss_after_kib=common.rss_kib(pid)["VmRSS"],
        gateway_counts=(await run.gateway("sockets"))["sockets"],
    )


async def bench_one(
    args: argparse.Namespace,
    n: int,
    gateways: redis_bench.Gateways,
    redis_pid: int | None,
    proto: int = 1,
    protocol: str = "socketio",
    spy: str = "",
) -> tuple[Connected, list[Result]]:
    books = Books()
    port = int(gateways.socket_urls[0].rsplit(":", 1)[1])
    run = Run(
        sockets=n,
        gateways=gateways,
        port=port,
        machine=redis_bench.Machine(gateways.pids, redis_pid, []),
        books=books,
        posters=Posters(args.host, port),
        cores=(args.server_cpu, args.client_cpu),
        proto=proto,
        protocol=protocol,
        spy=spy,
        spy_rate=args.py_spy_rate,
    )
    try:
        connected = await connect(run, args)
        print_connected(connected)
        results: list[Result] = []
        if not run.clients:
            return connected, results
        rng = random.Random(args.seed)
        warm_up = Phase("warm-up", lambda: b'[{"all":true}]', len(run.clients), 2, count=3)
        await run_phase(run, warm_up, args.drain)
        for phase in phases(args, len(run.clients), rng):
            if args.phases and PHASE_KEYS[phase.name] not in args.phases:
                continue
            result = await run_phase(run, phase, args.drain)
            results.append(result)
            print(
                f"  {phase.name}: {result.deliveries:,} deliveries, {result.rate_text()}",
                flush=True,
            )
        await disconnect_all(run)
        return connected, results
    finally:
        books.closing = True
        for client in run.clients:
            client.close()


async def disconnect_all(run: Run, limit: float = 120.0) -> None:
    """Close every socket at once from the client side; time the gateway's bookkeeping of it."""
    await run.gateway("stall")
    await run.gateway("gc")
    started = time.perf_counter()
    run.books.closing = True
    for client in run.clients:
        client.close()
    left = run.sockets
    while left > 0 and time.perf_counter() - started < limit:
        await asyncio.sleep(0.05)
        left = (await run.gateway("sockets"))["sockets"]["connected"]
    took = time.perf_counter() - started
    stall = (await run.gateway("stall"))["stall"]["longest"]
    collections = (await run.gateway("gc"))["gc"]
    print(
        f"  closed the {len(run.clients):,} sockets at once from the client side: the gateway "
        f"counted them all disconnected after {took:.2f} s ({left:,.0f} left); meanwhile its "
        f"longest event-loop stall was {common.human_ns(stall * 1e9)}, its cyclic GC took "
        f"{sum(collections['seconds']):.2f} s ({collections['collections'][2]} full "
        f"collections, longest {common.human_ns(max(collections['longest']) * 1e9)})",
        flush=True,
    )


# -- reporting --------------------------------------------------------------------------------


def pct(seconds: float, wall: float) -> str:
    return f"{100 * seconds / wall:.0f}%" if wall > 0 else "-"


def percentiles(latencies: array[int]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return common.percentile(ordered, 0.5), common.percentile(ordered, 0.99)


def print_connected(c: Connected) -> None:
    print(
        f"  connected and authenticated {c.opened:,} of {c.sockets:,} sockets in {c.wall:.2f} s "
        f"({c.rate:,.0f}/s); gateway CPU {c.gateway_cpu * 1e3 / max(c.opened, 1):.2f} ms, load "
        f"generator CPU {c.loadgen_cpu * 1e3 / max(c.opened, 1):.2f} ms per connection; gateway "
        f"RSS idle {c.rss_before_kib / 1024:,.0f} MiB -> {c.rss_after_kib / 1024:,.0f} MiB "
        f"({c.rss_per_socket_kib:,.1f} KiB per connection); the gateway counts "
        f"{c.gateway_counts['connected']:,.0f} connected, "
        f"{c.gateway_counts['authenticated']:,.0f} authenticated",
        flush=True,
    )
    if c.failures:
        print(f"  WARNING: {len(c.failures)} sockets could not connect; first: {c.failures[0]}")


HEADERS = [
    "phase",
    "window",
    "messages",
    "deliveries",
    "wall s",
    "deliveries/s",
    "p50",
    "p99",
    "POST p50",
    "gateway CPU",
    "gw µs/delivery",
    "gw µs/message",
    "loadgen CPU",
    "loadgen µs/delivery",
    "redis CPU",
    "other CPU",
    "gateway core busy (softirq)",
    "loadgen core busy (softirq)",
    "longest stall",
    "longest GC",
    "dropped (client/gateway)",
]


def result_row(r: Result) -> list[str]:
    median, p99 = percentiles(r.latencies)
    gw, loadgen = r.gateway_cpu, r.cpu["loadgen"]
    missing = r.expected - r.deliveries
    gateway_dropped = sum(r.gateway_drops.values())
    return [
        r.phase.name,
        str(r.phase.window),
        f"{r.messages:,}",
        f"{r.deliveries:,}" + (f" ({missing:,} missing)" if missing > 0 else ""),
        f"{r.wall:.2f}",
        f"{r.deliveries / r.wall:,.0f}" if r.wall > 0 else "-",
        common.human_ns(median),
        common.human_ns(p99),
        common.human_ns(common.percentile(sorted(r.post_times), 0.5)),
        pct(gw, r.wall),
        f"{gw * 1e6 / r.deliveries:.1f}" if r.deliveries else "-",
        f"{gw * 1e6 / r.messages:.0f}" if r.messages else "-",
        pct(loadgen, r.wall),
        f"{loadgen * 1e6 / r.deliveries:.1f}" if r.deliveries else "-",
        pct(r.cpu["redis"], r.wall),
        pct(r.cpu["other"], r.wall),
        *(f"{pct(busy, r.wall)} ({pct(softirq, r.wall)})" for busy, softirq in r.cores),
        common.human_ns(r.stall * 1e9),
        common.human_ns(r.gc_longest * 1e9),
        f"{r.dropped}/{gateway_dropped:.0f}",
    ]


def print_results(n: int, results: list[Result]) -> None:
    print(common.table(HEADERS, [result_row(r) for r in results]))
    for r in results:
        if r.gateway_drops:
            print(f"  {r.phase.name}: the gateway disconnected {r.gateway_drops}")
    late = sum(r.late for r in results)
    errors = sum(r.errors for r in results)
    if late or errors:
        print(f"  late or duplicate receipts: {late}; failed POSTs or abandoned messages: {errors}")
    busiest = max((100 * r.cpu["other"] / r.wall for r in results if r.wall >= 0.5), default=0)
    if busiest > 10:
        print(
            f"  WARNING: other processes used up to {busiest:.0f}% of a CPU during a phase; "
            "the figures are disturbed (the machine has 2 CPUs)"
        )


def check_target(n: int, results: list[Result]) -> None:
    """The issue's target: 100% at 10,000 for 30 s, no drop, stall < 100 ms, p99 < 1 s."""
    if n != TARGET_SOCKETS:
        return
    r = next(r for r in results if r.phase.name == "saturation, 100%")
    _, p99 = percentiles(r.latencies)
    dropped = r.dropped + sum(r.gateway_drops.values())
    checks = [
        (f"{r.phase.duration:g} s of sending (30 s asked)", (r.phase.duration or 0) >= 30),
        (f"{dropped:.0f} sockets dropped", dropped == 0),
        (f"longest stall {common.human_ns(r.stall * 1e9)} (< 100 ms)", r.stall < TARGET_STALL),
        (f"p99 {common.human_ns(p99)} (< 1 s)", p99 < TARGET_P99),
    ]
    verdict = "MET" if all(ok for _, ok in checks) else "MISSED"
    text = "; ".join(f"{what}: {'ok' if ok else 'NO'}" for what, ok in checks)
    print(f"  target (100% audience at 10,000 listeners, back to back): {verdict}: {text}")


def print_summary(runs: list[tuple[Connected, list[Result]]], names: list[str]) -> None:
    rows = []
    for (c, results), name in zip(runs, names, strict=True):
        by = {r.phase.name: r for r in results}

        def cell(name: str, what: str, by: dict[str, Result] = by) -> str:
            r = by.get(name)
            if r is None or not r.deliveries:
                return "-"
            if what == "rate":
                return f"{r.deliveries / r.wall:,.0f}" if r.wall > 0 else "-"
            if what == "cpu":
                return f"{r.gateway_cpu * 1e6 / r.deliveries:.1f}"
            median, p99 = percentiles(r.latencies)
            return f"{common.human_ns(median)} / {common.human_ns(p99)}"

        rows.append(
            [
                name,
                f"{c.sockets:,}",
                f"{c.rate:,.0f}/s",
                f"{c.rss_per_socket_kib:.1f}",
                *(cell(f"light, {a}", "lat") for a in ("1 listener", "10%", "100%")),
                *(cell(f"saturation, {a}", "rate") for a in ("1 listener", "10%", "100%")),
                *(cell(f"saturation, {a}", "cpu") for a in ("1 listener", "10%", "100%")),
                cell("saturation, 100%", "lat"),
                f"{max((r.stall for r in results), default=0) * 1e3:.0f} ms",
                f"{sum(r.dropped for r in results)}/"
                f"{sum(sum(r.gateway_drops.values()) for r in results):.0f}",
            ]
        )
    headers = ["gateway, clients", "L", "connect+auth", "KiB/conn"]
    headers += [f"light p50/p99 {a}" for a in ("1", "10%", "100%")]
    headers += [f"sat. deliveries/s {a}" for a in ("1", "10%", "100%")]
    headers += [f"gw µs/delivery {a}" for a in ("1", "10%", "100%")]
    headers += ["sat. 100% p50/p99", "longest stall", "dropped (client/gateway)"]
    print(common.table(headers, rows))


def print_comparison(
    runs: list[tuple[Connected, list[Result]]],
    keys: list[tuple[int, int, Variant]],
    tried: list[Variant],
) -> None:
    """Gateway CPU per delivery of every variant against the first, round by round."""
    first = tried[0]
    by: dict[tuple[int, int, Variant], dict[str, Result]] = {
        key: {r.phase.name: r for r in results}
        for key, (_, results) in zip(keys, runs, strict=True)
    }
    rows = []
    for (n, round_, variant), results in by.items():
        if variant == first:
            continue
        base = by.get((n, round_, first), {})
        for name, r in results.items():
            b = base.get(name)
            if b is None or not r.deliveries or not b.deliveries:
                continue
            mine, theirs = r.gateway_cpu / r.deliveries, b.gateway_cpu / b.deliveries
            rows.append(
                [
                    f"{n:,}",
                    str(round_ + 1),
                    name,
                    f"{theirs * 1e6:.1f}",
                    variant.name,
                    f"{mine * 1e6:.1f}",
                    f"{mine / theirs:.2f}" if theirs else "-",
                    f"{b.deliveries / b.wall:,.0f} / {r.deliveries / r.wall:,.0f}",
                ]
            )
    print(f"Gateway CPU per delivery, each variant against {first.name} of the same round:")
    headers = ["L", "round", "phase", f"{first.name} µs", "variant", "its µs", "ratio"]
    headers.append("deliveries/s (first / variant)")
    print(common.table(headers, rows))


def print_medians(
    runs: list[tuple[Connected, list[Result]]],
    keys: list[tuple[int, int, Variant]],
    tried: list[Variant],
    max_other: float | None = None,
) -> None:
    """Per variant and phase, over the rounds: the gateway's µs per delivery (median, range),
    and its ratio to each Socket.IO variant of the first gateway in the same round (median and
    range of the per-round ratios: each compares runs minutes apart, under the same load).
    With ``max_other`` (% of a CPU), the phases during which other processes used more are
    left out (of the ratios too)."""
    per: dict[tuple[int, Variant, str], dict[int, float]] = {}
    others: dict[tuple[int, Variant, str], list[float]] = {}
    rounds: dict[tuple[int, Variant, str], int] = {}
    for (n, round_, variant), (_, results) in zip(keys, runs, strict=True):
        for r in results:
            if not r.deliveries or r.wall <= 0:
                continue
            key = (n, variant, r.phase.name)
            rounds[key] = rounds.get(key, 0) + 1
            other = 100 * r.cpu["other"] / r.wall
            if max_other is not None and other > max_other:
                continue
            per.setdefault(key, {})[round_] = r.gateway_cpu * 1e6 / r.deliveries
            others.setdefault(key, []).append(other)
    references = [v for v in tried if v.protocol == "socketio" and v.source == tried[0].source]
    rows = []
    for (n, variant, phase), values in per.items():
        row = [
            f"{n:,}",
            variant.name,
            phase,
            f"{len(values)} of {rounds[n, variant, phase]}",
            median_range(others[n, variant, phase], "{:.0f}%"),
            median_range(list(values.values())),
        ]
        for reference in references:
            theirs = per.get((n, reference, phase), {})
            ratios = [mine / theirs[k] for k, mine in values.items() if theirs.get(k)]
            row.append("-" if reference == variant else median_range(ratios, "{:.2f}"))
        rows.append(row)
    print("Gateway µs per delivery over the rounds, median (min-max), and its ratio to each")
    print("Socket.IO variant of the first gateway, round by round (median of the ratios, min-max)")
    if max_other is not None:
        print(f"(phases during which other processes used over {max_other:g}% of a CPU left out):")
    headers = ["L", "variant", "phase", "rounds", "other CPU", "µs/delivery"]
    headers += [f"/ {reference.name}" for reference in references]
    print(common.table(headers, rows))


def median_range(values: list[float], form: str = "{:.1f}") -> str:
    if not values:
        return "-"
    middle = form.format(statistics.median(values))
    if len(values) == 1:
        return middle
    return f"{middle} ({form.format(min(values))}-{form.format(max(values))})"


# -- main -------------------------------------------------------------------------------------


def pin_gateway(pid: int, cpu: int) -> None:
    """``taskset`` every thread of the gateway onto ``cpu``."""
    subprocess.run(
        ["taskset", "-a", "-p", "-c", str(cpu), str(pid)], check=True, stdout=subprocess.DEVNULL
    )


@dataclass(frozen=True)
class Variant:
    """Which gateway (this checkout's, or ``--source``'s) and which protocol its clients speak."""

    proto: int  # Socket.IO's protocol (1 or 2)
    source: str | None = None  # a PYTHONPATH directory laid out by attack_bench.package_layout
    label: str = ""  # the commit or directory of ``source``
    protocol: str = "socketio"  # or flywheel, sse (then ``proto`` means nothing)

    @property
    def name(self) -> str:
        return f"{self.label or 'this'}, {self.clients}"

    @property
    def clients(self) -> str:
        return f"proto {self.proto}" if self.protocol == "socketio" else self.protocol


def variants(args: argparse.Namespace, workdir: str) -> list[Variant]:
    """``--protocol`` (Socket.IO in each ``--proto``) on this checkout's (or ``--gateway``'s)
    gateway, then Socket.IO in each ``--source-proto`` on each ``--source``'s."""
    import attack_bench  # here: it imports this module

    main, label = None, ""
    if args.gateway:  # a snapshot rather than the working tree, which others may be editing
        main = str(attack_bench.package_layout(Path(args.gateway), Path(workdir) / "gateway"))
        label = source_label(args.gateway)
    found = []
    for protocol in args.protocol:
        if protocol == "socketio":
            found += [Variant(int(p), main, label) for p in args.proto.split(",") if p]
        else:
            found.append(Variant(2, main, label, protocol))
    for k, source in enumerate(args.source or []):
        path = attack_bench.package_layout(Path(source), Path(workdir) / f"source{k}")
        for p in args.source_proto.split(","):
            if p:
                found.append(Variant(int(p), str(path), source_label(source)))
    return found


def source_variant(source: str | None, proto: int, workdir: str) -> Variant:
    """Protocol ``proto`` on ``source``'s gateway (a checkout), or on this working tree's."""
    if not source:
        return Variant(proto)
    import attack_bench  # here: it imports this module

    path = attack_bench.package_layout(Path(source), Path(workdir) / "source")
    return Variant(proto, str(path), source_label(source))


def source_label(source: str) -> str:
    """``source``'s directory, and the commit ``git archive`` wrote into it if it says."""
    name = Path(source).name
    return name if name.startswith("bow-") else source


def start_variant(
    variant: Variant, redis: RedisServer | None, namespace: str, extra: Sequence[str] = ()
) -> redis_bench.Gateways:
    """One ``_gateway.py`` (through ``PYTHONPATH`` for another checkout's gateway)."""
    env = dict(os.environ)
    if variant.source:
        env["PYTHONPATH"] = variant.source
    command = [sys.executable, str(redis_bench.HERE / "_gateway.py"), "--namespace", namespace]
    if redis is not None:
        command += ["--redis", redis.url]
    command += extra
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd=variant.source or None,  # no bow_gateway in the cwd to shadow the one meant
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.wait(5)
        raise SystemExit(f"the gateway did not start (exit status {process.returncode})")
    started = json.loads(line)
    port, pid = started["port"], started["pid"]
    if variant.source and not started.get("bow_gateway", "").startswith(variant.source):
        process.kill()
        raise SystemExit(f"the gateway imported {started.get('bow_gateway')}, not the source's")
    url = f"http://127.0.0.1:{port}"
    backplane = "in-process backplane" if redis is None else "Redis backplane"
    return redis_bench.Gateways(
        description=f"_gateway.py of {variant.label or 'this checkout'} ({backplane}) on port "
        f"{port}, pid {pid}; clients speak {client_text(variant)}",
        processes=[process],
        pids=[pid],
        socket_urls=[url],
        post_urls=[url + gateway.PATH],
        version=gateway.OUTBOUND_VERSION,
        secret=gateway.SECRET,
        user=gateway.USER,
        password=gateway.PASSWORD,
        controllable=True,
    )


def spy_prefix(directory: str | None, n: int, variant: Variant, round_: int) -> str:
    """Where ``--py-spy`` puts this run's profiles: ``DIR/{L}-{variant}-r{round}``."""
    if not directory:
        return ""
    name = re.sub(r"[^A-Za-z0-9]+", "-", variant.name).strip("-")
    return str(Path(directory) / f"{n}-{name}-r{round_ + 1}")


def client_text(variant: Variant) -> str:
    if variant.protocol == "socketio":
        return f"Socket.IO protocol {variant.proto}"
    return {"flywheel": f"Flywheel (subscribed to {EVENT!r})", "sse": "SSE"}[variant.protocol]


def run_size(
    args: argparse.Namespace,
    n: int,
    redis: RedisServer | None,
    variant: Variant = Variant(1),
    round_: int = 0,
) -> tuple[Connected, list[Result]]:
    if redis is not None:
        redis.flush()
    if args.quiet > 0:
        common.wait_for_quiet(args.quiet)
    gateways = start_variant(variant, redis, f"fanout{n}")
    pin_gateway(gateways.pids[0], args.server_cpu)
    print()
    print(
        f"== {n:,} sockets: {gateways.description}, pinned to CPU {args.server_cpu}; load "
        f"average {common.load_average()}",
        flush=True,
    )
    try:
        connected, results = asyncio.run(
            bench_one(
                args,
                n,
                gateways,
                redis.pid if redis else None,
                variant.proto,
                variant.protocol,
                spy_prefix(args.py_spy, n, variant, round_),
            )
        )
    finally:
        gateways.stop()
    if results:
        print(
            f"{n:,} listeners ({sum(1 for i in range(connected.opened) if i % 10 == 0):,} in "
            "the 10% group). Latency: POST start to the client's data_received, per delivery. "
            "CPU: CPU s / wall s (100% = one CPU)."
        )
        print_results(n, results)
        check_target(n, results)
    return connected, results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--sockets", default="1000,10000", help="comma-separated values of L")
    parser.add_argument("--duration", type=float, default=30.0, help="s, saturation at 100%%")
    parser.add_argument(
        "--short-duration", type=float, default=10.0, help="s, saturation at 1 listener and 10%%"
    )
    parser.add_argument("--window", type=int, default=4, help="outstanding messages, 10%%/100%%")
    parser.add_argument("--window-one", type=int, default=64, help="outstanding, 1 listener")
    parser.add_argument("--light-one", type=int, default=1000, help="messages, light 1 listener")
    parser.add_argument("--light-group", type=int, default=200, help="messages, light 10%%")
    parser.add_argument("--light-all", type=int, default=30, help="messages, light 100%%")
    parser.add_argument("--connect-concurrency", type=int, default=100)
    parser.add_argument("--drain", type=float, default=15.0, help="s to wait for stragglers")
    parser.add_argument("--idle", type=float, default=2.0, help="s idle before reading RSS")
    parser.add_argument(
        "--quiet", type=float, default=30.0, help="s to wait for a quiet machine before each L"
    )
    parser.add_argument("--redis", action="store_true", help="the Redis backplane (private)")
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--proto",
        default="1",
        help="Socket.IO protocols of the clients of this checkout's gateway, e.g. 1,2 to "
        "compare them",
    )
    parser.add_argument(
        "--protocol",
        default="socketio",
        help="wire protocols of the clients of this checkout's gateway, comma-separated among "
        + ", ".join(PROTOCOLS)
        + " (socketio: in each --proto)",
    )
    parser.add_argument(
        "--gateway",
        help="the gateway whose clients speak --proto: another checkout's (e.g. /tmp/bow-HEAD "
        "from `git archive`) rather than this working tree's",
    )
    parser.add_argument(
        "--source",
        action="append",
        help="also run another checkout's gateway (Socket.IO in --source-proto), e.g. "
        "/tmp/bow-5bc2fea from `git archive`; repeatable",
    )
    parser.add_argument(
        "--source-proto", default="1", help="Socket.IO protocols of the --source gateways' clients"
    )
    parser.add_argument(
        "--phases",
        default="",
        help="only these phases (comma-separated among " + ", ".join(PHASE_KEYS.values()) + ")",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the variants (gateway, protocol) this many times each, interleaved, for each L",
    )
    parser.add_argument(
        "--py-spy",
        metavar="DIR",
        help="profile the gateway during each phase with py-spy (pip install py-spy), raw "
        "collapsed stacks in DIR/{L}-{variant}-r{round}-{phase}.txt; it inflates the CPU figures",
    )
    parser.add_argument(
        "--max-other",
        type=float,
        help="%% of a CPU: the medians over the rounds leave out the phases during which other "
        "processes used more",
    )
    parser.add_argument("--py-spy-rate", type=int, default=250, help="py-spy samples per second")
    args = parser.parse_args(argv)
    if args.py_spy:
        Path(args.py_spy).mkdir(parents=True, exist_ok=True)
    args.phases = [p for p in args.phases.split(",") if p]
    unknown = set(args.phases) - set(PHASE_KEYS.values())
    if unknown:
        parser.error(f"unknown phases {sorted(unknown)}")
    args.protocol = [p for p in args.protocol.split(",") if p]
    if set(args.protocol) - set(PROTOCOLS):
        parser.error(f"unknown protocols {sorted(set(args.protocol) - set(PROTOCOLS))}")
    sizes = [int(s.replace("_", "")) for s in args.sockets.split(",") if s]

    soft, hard = redis_bench.raise_open_files_limit()
    if soft != resource.RLIM_INFINITY and soft < max(sizes) + 100:
        print(f"WARNING: RLIMIT_NOFILE is {soft} (hard {hard}): {max(sizes):,} sockets won't fit")
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("two CPUs are needed: one for the gateway, one for the load generator")
    print(common.environment(["aiohttp", "python-socketio", "python-engineio", "PyJWT", "redis"]))
    print(f"bow_gateway: {redis_bench.git_state()}")
    os.sched_setaffinity(0, {args.client_cpu})
    redis = RedisServer(cpu=args.client_cpu) if args.redis else None
    backplane = (
        f"Redis (private redis-server {redis.version()}, pid {redis.pid}, on CPU {args.client_cpu})"
        if redis
        else "in-process"
    )
    print(
        f"backplane: {backplane}; load generator (this process, pid {os.getpid()}) on CPU "
        f"{args.client_cpu}; open files limit {soft}"
    )
    runs = []
    names = []
    keys: list[tuple[int, int, Variant]] = []
    with tempfile.TemporaryDirectory(prefix="fanout-") as workdir:
        tried = variants(args, workdir)
        for variant in tried:
            if variant.source:
                print(f"{variant.name}: bow_gateway from {variant.source}")
        try:
            for n in sizes:
                for round_ in range(args.rounds):
                    for variant in tried:
                        runs.append(run_size(args, n, redis, variant, round_))
                        names.append(variant.name)
                        keys.append((n, round_, variant))
        finally:
            if redis is not None:
                redis.stop()
    print()
    print("Summary (latency p50 / p99 per delivery; saturation = back to back):")
    print_summary(runs, names)
    if len(tried) > 1:
        print()
        print_comparison(runs, keys, tried)
    if len(tried) > 1 or args.rounds > 1:
        print()
        print_medians(runs, keys, tried, args.max_other)
    dropped = sum(r.dropped + sum(r.gateway_drops.values()) for _, rs in runs for r in rs)
    failed = sum(len(c.failures) for c, _ in runs)
    print(f"\nload average now: {common.load_average()}")
    if dropped or failed:
        print(f"FAILED: {dropped:.0f} sockets dropped, {failed} could not connect")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
