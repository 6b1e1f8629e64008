"""The lean Server-Sent Events client (``docs/sse.md``): raw HTTP/1.1, one event a chunk."""

from __future__ import annotations

import asyncio
import json

from lib import gateway
from lib.lean.books import EVENT_BYTES, Books, Message, monotonic_ns
from lib.lean.websocket import LeanClient

SSE_PATH = f"/events?v={gateway.OUTBOUND_VERSION}"


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
