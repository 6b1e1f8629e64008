"""Engine.IO's long-polling transport, bounded: a poll response carries at most what
python-engineio's client accepts, the queue is counted in bytes, a POST at most
``max_http_buffer_size`` bytes, and a client that stops polling is dropped. A mixin of
:class:`~.transport.LeanSocket`, over engineio's :class:`~engineio.async_socket.AsyncSocket`."""

from __future__ import annotations

import abc
import asyncio
import traceback
from typing import Any, Final

from engineio import exceptions as eio_exceptions
from engineio import packet as eio_packet
from engineio.async_socket import AsyncSocket
from engineio.payload import Payload

from .guard import ProtocolViolation
from .socket_state import LeanState

POLL_PACKETS: Final = Payload.max_decode_packets
"""At most this many packets in one poll response: python-engineio's client refuses more (and
reconnects, abandoning what the response carried)."""
POLL_BYTES: Final = 262_144
"""A poll response stops growing past this many bytes (its first packet always goes)."""
PACKET_OVERHEAD: Final = 64
"""Bytes a queued packet is counted for beyond its data, so that tiny ones are bounded too."""


class LongPolling(AsyncSocket, abc.ABC):  # type: ignore[misc]
    """A socket's long-polling half: engineio's queue, bounded."""

    _lean: LeanState  # set by make_lean
    queue: Any  # engineio's asyncio.Queue (DRAINED once a websocket), set by its constructor

    @abc.abstractmethod
    async def shut(self, *, abort: bool = False, reason: Any = None) -> None:
        """Close the connection without waiting on its client (the websocket half's)."""

    @abc.abstractmethod
    async def violated(self, error: Exception) -> None:
        """A protocol violation: log it once, cut the client off (the websocket half's)."""

    def enqueue(self, data: str) -> bool:
        """Queue a MESSAGE for a long-poll now, without yielding (delivery order is kept across
        sockets); False if the socket is (becoming) a websocket or closed."""
        if self._lean.transport is not None or self._lean.websocket is not None or self.closing:
            return False
        pkt = eio_packet.Packet(eio_packet.MESSAGE, data)
        self._lean.queued_bytes += packet_size(pkt)
        self.queue.put_nowait(pkt)
        return True

    async def poll(self) -> list[eio_packet.Packet]:
        """What waits for a long-poll, bounded by :data:`POLL_PACKETS` and :data:`POLL_BYTES`:
        the rest stays queued for the next poll."""
        try:
            async with asyncio.timeout(self.server.ping_interval + self.server.ping_timeout):
                first = await self.queue.get()
        except (TimeoutError, asyncio.CancelledError):
            raise eio_exceptions.QueueEmpty() from None
        self.queue.task_done()
        if first is None:
            return []
        packets = [first]
        size = packet_size(first)
        while len(packets) < POLL_PACKETS and size < POLL_BYTES and not self.queue.empty():
            pkt = self.queue.get_nowait()
            self.queue.task_done()
            if pkt is None:  # closed: the poll after this one ends at once
                self.queue.put_nowait(None)
                break
            packets.append(pkt)
            size += packet_size(pkt)
        self._lean.queued_bytes = max(0, self._lean.queued_bytes - size)
        return packets

    async def long_poll(self, environ: dict[str, Any]) -> Any:
        """engineio's answer to a long-polling GET; the client must poll again within
        ``ping_timeout`` once it has it."""
        self._lean.polls += 1
        try:
            return await super().handle_get_request(environ)
        except eio_exceptions.QueueEmpty as error:  # a long-poll that waited in vain
            # engineio raised it from a frame that holds it in a local (sys.exc_info()): a cycle
            traceback.clear_frames(error.__traceback__)
        finally:
            self._lean.polls -= 1
            # Not while another poll waits (a stale one the client left after a network blip)
            lean = self._lean
            if not (lean.polls or self.upgrading or self.upgraded or self.closing or self.closed):
                # A long-polling client polls again as soon as it has a response: one that
                # does not within ping_timeout has gone, and nothing should wait for it.
                loop = asyncio.get_running_loop()
                self._lean.poll_timer = loop.call_later(self.server.ping_timeout, self._poll_missed)
        raise eio_exceptions.QueueEmpty()

    def _poll_missed(self) -> None:
        self._lean.poll_timer = None
        if not (self.upgrading or self.upgraded or self.closing or self.closed):
            reason = self.server.reason.PING_TIMEOUT
            self._lean.closer = asyncio.ensure_future(self.shut(abort=True, reason=reason))

    def _cancel_poll_timer(self) -> None:
        if self._lean.poll_timer is not None:
            self._lean.poll_timer.cancel()
            self._lean.poll_timer = None

    async def handle_post_request(self, environ: dict[str, Any]) -> None:
        """Packets a long-polling client sent: at most ``max_http_buffer_size`` bytes of them."""
        limit = self.server.max_http_buffer_size
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            if length > limit:
                raise ProtocolViolation(f"a POST of {length} bytes (at most {limit})")
            timeout = self.server.body_timeout
            try:
                async with asyncio.timeout(timeout):
                    body = await environ["wsgi.input"].read(length)
            except TimeoutError:
                raise ProtocolViolation(f"a POST whose body took over {timeout:g} s") from None
            try:
                packets = Payload(encoded_payload=body.decode()).packets
            except ValueError as error:  # also a body that is not UTF-8
                raise ProtocolViolation(f"a malformed payload ({error})") from None
            for pkt in packets:
                if self.closing or self.closed:  # an earlier packet of this POST ended it
                    return
                await self.receive(pkt)
        except ProtocolViolation as error:
            await self.violated(error)
            if self.sid in self.server.sockets:
                raise  # engineio answers 400 and forgets the socket
            # Already forgotten (shut while this POST ran): engineio's handler would fail on it


def packet_size(pkt: eio_packet.Packet) -> int:
    data = pkt.data
    return PACKET_OVERHEAD + (len(data) if isinstance(data, str | bytes) else 0)
