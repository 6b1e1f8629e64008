"""Engine.IO's transports, lean and guarded: no task, queue or timer per websocket packet, no
compression, and a client that breaks the protocol costs only its own connection.

python-engineio serves a websocket with a reader loop that starts a task and a ``wait_for`` per
packet received, a writer task that waits on a queue (another ``wait_for`` and task per wake-up)
and a task per socket per ping: at 10,000 sockets, most of the gateway's objects, memory and
idle CPU. :class:`LeanSocket` keeps engineio's protocol and its server's bookkeeping, and
replaces that machinery for the websocket transport: the websocket's driver (:mod:`.websocket`)
hands each message to :meth:`LeanSocket.received` (a PONG, or a Socket.IO acknowledgement of a
receipt's event, is handled there and then; other packets by a task that lives only while some
wait), packets are written straight to the
transport, pings go from one timer per tick for all sockets (:mod:`.pings`), and a client that
stops answering them is closed by engineio's service task. Long-polling
sockets keep engineio's queue, with bounds: a poll response carries at most what python-engineio's
client accepts, the queue is counted in bytes, and a client that stops polling is dropped.

Whatever the transport, a client may send only what Engine.IO clients send (``PONG``, text
``MESSAGE``, ``CLOSE``), each packet at most ``max_http_buffer_size`` bytes, at a bounded rate:
anything else closes its connection at once, with one rate-limited log line and no traceback.

The seams it relies on are python-engineio 4.15's (the package's ``__init__`` checks the version):
the server's ``_async["websocket"]`` driver (:mod:`.websocket`),
:class:`engineio.async_socket.AsyncSocket`'s methods,
and python-socketio's ``_handle_eio_connect``, where :func:`make_lean` turns each new socket into
a :class:`LeanSocket` before its first ping or websocket handshake.

The long-polling half is :mod:`.polling`, what a client may send :mod:`.guard`, what a lean
socket keeps :mod:`.socket_state`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import deque
from typing import Any, Final, Protocol

from engineio import exceptions as eio_exceptions
from engineio import packet as eio_packet
from engineio.async_socket import AsyncSocket

from ..runtime.ratelimit import TokenBucket, rate_limited
from ..wire.frames import websocket_frame
from .guard import INCOMING_BURST, INCOMING_RATE, Flooded, ProtocolViolation, admit, decode
from .pings import PING_FRAME, PingWheel
from .polling import LongPolling, packet_size
from .socket_state import DRAINED, LeanState

logger = rate_limited("bow_gateway.transport")

INBOX: Final = 16
"""Packets of a websocket waiting to be handled before its reading pauses."""
_ACK: Final = re.compile(r"3([0-9]{1,18})(\[.*)", re.DOTALL)
"""A Socket.IO ACK on ``/`` with an id and a JSON list (python-socketio's ``3<id><JSON>``)."""


class Acknowledged(Protocol):
    """The server's hook for a client's acknowledgement (``ServerHooks.acknowledged``)."""

    def __call__(self, eio_sid: str, ack_id: int) -> bool: ...


def _frame_of(pkt: eio_packet.Packet) -> bytes:
    encoded = pkt.encode()
    if isinstance(encoded, bytes):
        return websocket_frame(encoded, binary=True)
    return websocket_frame(encoded.encode())


class LeanSocket(LongPolling):
    """An engineio socket whose websocket transport needs no task per packet (module doc)."""

    @property
    def transport(self) -> asyncio.Transport | None:
        """Set while the socket is a websocket: what is sent is written straight to it."""
        return self._lean.transport

    @property
    def queued_bytes(self) -> int:
        """What waits in engineio's queue for a long-poll, in bytes (:data:`PACKET_OVERHEAD`
        each)."""
        return self._lean.queued_bytes

    # engineio's own state, set by its constructor
    last_ping: float | None
    connected: bool
    upgraded: bool
    upgrading: bool
    closing: bool
    closed: bool

    def write(self, frame: bytes) -> bool:
        """Write a whole WebSocket frame now, if the socket is an open websocket."""
        transport = self._lean.transport
        if transport is None or transport.is_closing():
            return False
        transport.write(frame)
        return True

    async def send(self, pkt: eio_packet.Packet) -> None:
        if self._lean.transport is not None:
            if await self.check_ping_timeout():
                self.write(_frame_of(pkt))
        elif self._lean.websocket is None:
            self._lean.queued_bytes += packet_size(pkt)
            await super().send(pkt)  # long-polling, or not upgraded yet: engineio's queue
        # else the websocket is ending: nothing would ever read the queue

    def schedule_ping(self) -> None:
        if self.closing or self.closed:
            return
        if self.last_ping:  # the previous ping was answered (or none was sent)
            self.last_ping = None
            self._lean.ping_due = PingWheel.of(self.server).add(self, self.server.ping_interval)

    def _ping(self) -> None:
        self._lean.ping_due = None
        if self.closing or self.closed:
            return
        self.last_ping = time.time()
        if self._lean.websocket is None:
            self.queue.put_nowait(eio_packet.Packet(eio_packet.PING))  # long-polling
        else:
            self.write(PING_FRAME)

    async def handle_get_request(self, environ: dict[str, Any]) -> Any:
        self._cancel_poll_timer()
        if _upgrades_to_websocket(environ):
            # engineio's own path (its handle_get_request, then _upgrade_websocket), inlined:
            # their coroutine frames would be kept for the websocket's whole life
            if self.upgraded:
                raise OSError("Socket has been upgraded already")
            driver = self.server._async["websocket"]
            if driver is None:
                return self.server._bad_request()
            return await driver(self._websocket_handler, self.server)(environ)
        return await self.long_poll(environ)

    async def receive(self, pkt: eio_packet.Packet) -> None:
        self._admit(pkt)
        await super().receive(pkt)

    def _admit(self, pkt: eio_packet.Packet) -> None:
        bucket = self._lean.incoming
        if bucket is None:
            bucket = self._lean.incoming = TokenBucket(INCOMING_RATE, INCOMING_BURST)
        admit(pkt, bucket)

    def received(self, data: str | bytes) -> bool:
        """A message of this socket's websocket, from its driver, in order: a PONG or a Socket.IO
        acknowledgement with nothing before it waiting is handled now, anything else by a task
        that lives while there is something to read. False once :data:`INBOX` wait (the driver
        pauses its reading)."""
        if self._lean.inbox is None and type(data) is str and data[:2] == "43":
            if self._acknowledged(data[1:]):  # a MESSAGE carrying a Socket.IO ACK: done
                return True
        try:
            pkt = decode(data)
            self._admit(pkt)
        except ProtocolViolation as error:
            self._take_in(error)
            return False  # closed next: nothing more is read
        if self._lean.inbox is None and pkt.packet_type == eio_packet.PONG:
            self.schedule_ping()  # what engineio's receive() does with a PONG
            return True
        return self._take_in(pkt)

    def _acknowledged(self, data: str) -> bool:
        """The data of an Engine.IO MESSAGE that is a Socket.IO ACK on ``/`` (``3<id><JSON>``,
        the acknowledgement of a receipt's event), nothing of the socket's waiting before it:
        admitted (a token of the client's rate, as any packet), then told straight to the
        server's ``acknowledged`` hook, as python-socketio would through two tasks, its decoding
        and ``Server._handle_ack``. False for anything else (another namespace, attachments,
        malformed JSON, a closing socket, past the rate): the normal way, which decodes it and
        alerts, closes or ignores as before."""
        if self.closing or self.closed:
            return False
        acknowledged: Acknowledged | None = getattr(self.server, "acknowledged", None)
        matched = _ACK.fullmatch(data)
        if acknowledged is None or matched is None:
            return False
        rest = matched[2]
        if rest != "[]":
            try:
                json.loads(rest)
            except ValueError:
                return False  # python-socketio's decoding fails it: an alert and a disconnect
        bucket = self._lean.incoming
        if bucket is None:
            bucket = self._lean.incoming = TokenBucket(INCOMING_RATE, INCOMING_BURST)
        if not bucket.take():
            return False  # spent nothing: the normal way finds it past the rate too
        try:
            if acknowledged(self.sid, int(matched[1])):
                bucket.give_back()  # an acknowledgement the gateway asked for costs no token
        except Exception:  # as python-socketio's handler would have logged it
            logger.exception("Engine.IO connection %s: an acknowledgement failed", self.sid)
        return True

    def give_back(self) -> None:
        """A packet taken in turned out to be one the gateway asked for (an expected
        acknowledgement, read the normal way): its token back."""
        if self._lean.incoming is not None:
            self._lean.incoming.give_back()

    def lost(self) -> None:
        """The websocket ended (either side closed it, or the connection was lost)."""
        self._take_in(None)

    def _take_in(self, item: eio_packet.Packet | ProtocolViolation | None) -> bool:
        inbox = self._lean.inbox
        if inbox is None:
            inbox = self._lean.inbox = deque()
            self._lean.reader = asyncio.ensure_future(self._read(inbox))
        inbox.append(item)
        return len(inbox) < INBOX

    async def _read(self, inbox: deque[eio_packet.Packet | ProtocolViolation | None]) -> None:
        """What the websocket took in, in order: packets, a violation, its end."""
        try:
            while inbox:
                item = inbox.popleft()
                try:
                    if item is None:
                        await self._ended()
                    elif isinstance(item, ProtocolViolation):
                        await self.violated(item)
                    elif not (self.closing or self.closed):
                        await AsyncSocket.receive(self, item)
                except eio_exceptions.SocketIsClosedError:
                    pass
                except Exception:  # the packets after it, and the websocket's end, still count
                    logger.exception("Engine.IO connection %s: a packet failed", self.sid)
        finally:
            self._lean.inbox = self._lean.reader = None
            websocket = self._lean.websocket
            if websocket is not None and not (self.closing or self.closed):
                websocket.resume()

    async def _ended(self) -> None:
        """Close the socket whose websocket ended, and forget it (engineio's request handler
        did, once its websocket's handler returned)."""
        self._lean.transport = None
        await self.close(wait=False, abort=True, reason=self.server.reason.TRANSPORT_CLOSE)
        if self.server.sockets.get(self.sid) is self:
            del self.server.sockets[self.sid]

    async def violated(self, error: Exception) -> None:
        """Close this connection for what its client sent; say so once, without a traceback.

        The socket stays in the server's table: engineio's request handler forgets it.
        """
        logger.info("closing Engine.IO connection %s: it sent %s", self.sid, error)
        flooded: Flooded | None = getattr(self.server, "flooded", None)
        over_websocket = self._lean.websocket is not None
        if getattr(error, "flood", False) and over_websocket and flooded is not None:
            if await flooded(self.sid, str(error)):
                return  # closed by the outbound, with 4011
        await self.close(wait=False, abort=True, reason=self.server.reason.TRANSPORT_ERROR)

    async def shut(self, *, abort: bool = False, reason: Any = None) -> None:
        """Close now, without waiting on the client, and forget the socket.

        engineio's own ``disconnect`` waits until the client has fetched the CLOSE packet, which
        a long-polling client that has left never does. ``abort``: no CLOSE packet, so that the
        client takes it for a lost connection and reconnects.
        """
        self.server.sockets.pop(self.sid, None)
        reason = reason or self.server.reason.SERVER_DISCONNECT
        await self.close(wait=False, abort=abort, reason=reason)

    async def close(self, wait: bool = True, abort: bool = False, reason: Any = None) -> None:
        if self._lean.ping_due is not None:
            PingWheel.of(self.server).discard(self, self._lean.ping_due)
            self._lean.ping_due = None
        self._cancel_poll_timer()
        was_open = not (self.closing or self.closed)
        await super().close(wait=wait, abort=abort, reason=reason)
        websocket = self._lean.websocket
        if websocket is not None:
            # The driver tells lost() once the connection ends: when the client answers the
            # close frame, or at once for an abort
            websocket.close(now=abort)
        elif abort and was_open:
            # Ends a long-poll under way, which would otherwise wait out its 45 s: also when
            # the client itself sent CLOSE (python-socketio's client then waited that long).
            self.queue.put_nowait(None)

    async def _websocket_handler(self, ws: Any) -> None:
        """Engine.IO over this websocket: the upgrade handshake, then the driver hands what it
        reads to :meth:`received`."""
        if self.connected:  # an upgrade from long-polling
            self.upgrading = True  # engineio queues what is sent meanwhile
            try:
                probe = eio_packet.Packet(encoded_packet=await ws.wait())
                if probe.packet_type != eio_packet.PING or probe.data != "probe":
                    self.upgrading = False
                    return
                await ws.send(eio_packet.Packet(eio_packet.PONG, data="probe").encode())
                await self.queue.put(eio_packet.Packet(eio_packet.NOOP))  # ends the poll
                upgrade = eio_packet.Packet(encoded_packet=await ws.wait())
            except (OSError, ValueError):
                self.upgrading = False
                return
            if upgrade.packet_type != eio_packet.UPGRADE:
                self.upgraded = self.upgrading = False
                return
            self.upgraded, self.upgrading = True, False
            ws.environ.clear()  # the upgrade request's headers (~1 KB), which no one reads again
        else:
            self.connected = self.upgraded = True
        # What waits in the queue (the OPEN packet, or what the long-polling client has not
        # fetched) is written first, then everything goes straight to the transport: in order.
        self._lean.websocket = ws
        self._lean.transport = ws.transport
        while not self.queue.empty():
            pkt = self.queue.get_nowait()
            self.queue.task_done()
            if pkt is not None:
                self.write(_frame_of(pkt))
        self.queue = DRAINED
        self._lean.queued_bytes = 0
        if self.closing or self.closed:  # closed while upgrading
            self._lean.transport = None
            ws.close(now=True)
            return
        # From now on the driver hands what it reads to received(), and this handler returns:
        # no coroutine frame, task or timer is kept for an idle websocket. A client that stops
        # answering pings is closed by engineio's service task (check_ping_timeout).
        ws.attach(self)


def _upgrades_to_websocket(environ: dict[str, Any]) -> bool:
    """engineio's test for a request to upgrade to a websocket."""
    connection = environ.get("HTTP_CONNECTION", "").lower()
    return environ.get("HTTP_UPGRADE", "").lower() == "websocket" and "upgrade" in {
        token.strip() for token in connection.split(",")
    }


def make_lean(server: Any, eio_sid: str) -> None:
    """Turn engineio's new socket ``eio_sid`` into a :class:`LeanSocket` (same state, methods)."""
    socket = server.sockets.get(eio_sid)
    if type(socket) is AsyncSocket:
        socket._lean = LeanState()
        socket.__class__ = LeanSocket
