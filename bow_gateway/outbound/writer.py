"""Writing to one connection without a task per packet: straight to its websocket, into its
long-poll queue, or behind a replay under way; a socket over its buffer is slow (4008).

A transport's first frame in an event-loop step is written at once; the frames after it in the
same step are held and written together when the step ends (one ``send()`` for a run of
messages read in one batch from the backplane, rather than one each).

The bytes waiting for the sockets of one listener id on the instance are bounded too
(``max_buffered_bytes_per_id``): a token held by many slow readers (100 streams that never
read) costs a few MiB, not 100 times ``max_buffered_bytes``. A socket is counted once more than
:data:`COUNTED_FROM` bytes wait for it (a reader keeping up never is: one comparison a write),
at what waited at its last write over it; a sum over the bound is measured again before a
socket is closed for it, so a count gone stale never closes one."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from socket import AF_INET, AF_INET6, SO_SNDBUF, SOL_SOCKET
from typing import Final

from ..core.criteria import ListenerId
from .connection import Connection

REPLAY_LOW_WATER: Final = 65_536  # a replay writes on while the socket buffers less than this
KERNEL_BUFFER_MAX: Final = 262_144  # the most of a websocket's send buffer left to the kernel
COUNTED_FROM: Final = 16_384  # bytes waiting for a socket from which they count for its id


class Writer:
    """Writes encoded packets to connections (framed by their codec); ``slow(connection)``
    when one is over ``max_buffered_bytes``, ``crowded(connection)`` (``slow`` if not given)
    when the sockets of its listener id are over ``max_buffered_bytes_per_id`` (0: no limit)."""

    def __init__(
        self,
        slow: Callable[[Connection], None],
        *,
        max_buffered_bytes: int = 1_048_576,
        max_buffered_bytes_per_id: int = 0,
        crowded: Callable[[Connection], None] | None = None,
    ) -> None:
        self._slow = slow
        self._crowded = crowded or slow
        self.max_buffered_bytes = max_buffered_bytes
        self.max_buffered_bytes_per_id = max_buffered_bytes_per_id
        # Past it, what waits for a socket counts for its id (at most what closes it alone)
        self._counted_from = min(COUNTED_FROM, max_buffered_bytes)
        # Per listener id: its sockets counted (what waited at their last write), their sum
        self._behind: dict[ListenerId, tuple[dict[Connection, int], list[int]]] = {}
        self._step = 0  # counts event-loop steps in which something was written
        self._step_ends: asyncio.Handle | None = None  # the callback that ends the step
        self._holding: list[Connection] = []  # connections with frames held in this step

    def write(self, connection: Connection, encoded: bytes, frame: bytes | None = None) -> bool:
        """Send one packet now, in order with everything sent before; False if it was not."""
        if connection.closing is not None:
            return False
        backlog = connection.backlog
        if backlog is not None:  # a replay is being written: behind it
            backlog.append(encoded)
            waiting = connection.backlog_bytes = connection.backlog_bytes + len(encoded)
            if waiting > self._counted_from:
                if waiting > self.max_buffered_bytes:
                    self._slow(connection)
                    return False
                if self._crowding(connection, waiting):
                    self._crowded(connection)
                    return False
            return True
        return self._send(connection, encoded, frame, self.max_buffered_bytes)

    def _send(
        self, connection: Connection, encoded: bytes, frame: bytes | None, limit: int | None
    ) -> bool:
        """Write to the websocket or the long-poll queue; over ``limit`` (None: none) it is slow."""
        transport = connection.transport
        if transport is None:
            socket = connection.socket
            if socket is None or socket.closed:
                return False
            if socket.transport is None:  # long-polling (or upgrading)
                if limit is not None and socket.queued_bytes > self._counted_from:
                    if socket.queued_bytes > limit:
                        self._slow(connection)
                        return False
                    if self._crowding(connection, socket.queued_bytes):
                        self._crowded(connection)
                        return False
                return socket.enqueue(encoded.decode())
            transport = connection.transport = socket.transport
            self.bound_kernel_buffer(transport)
        if transport.is_closing():
            return False
        if limit is not None:
            waiting = transport.get_write_buffer_size() + connection.held_bytes
            if waiting > self._counted_from:
                if waiting > limit:
                    self._slow(connection)
                    return False
                if self._crowding(connection, waiting):
                    self._crowded(connection)
                    return False
        if frame is None:
            frame = connection.codec.frame(encoded)
        held = connection.held
        if held is not None:
            held.append(frame)
            connection.held_bytes += len(frame)
        elif connection.wrote_in == self._step:  # its second frame in this step: held
            connection.held = [frame]
            connection.held_bytes = len(frame)
            self._holding.append(connection)
        else:
            connection.wrote_in = self._step
            if self._step_ends is None:
                self._step_ends = asyncio.get_running_loop().call_soon(self._end_step)
            transport.write(frame)
        return True

    def _crowding(self, connection: Connection, waiting: int) -> bool:
        """Count ``waiting`` bytes for ``connection``'s id: whether its sockets, measured again,
        are over ``max_buffered_bytes_per_id``."""
        listener_id = connection.listener_id
        limit = self.max_buffered_bytes_per_id
        if listener_id is None or not limit:  # anonymous: max_anonymous bounds them
            return False
        behind = self._behind.get(listener_id)
        if behind is None:
            behind = self._behind[listener_id] = ({}, [0])
        counted, total = behind
        total[0] += waiting - counted.get(connection, 0)
        counted[connection] = waiting
        if total[0] <= limit:
            return False
        # Over, by what each counted socket had waiting at its last write: measure them now
        # (only those still behind stay counted).
        total[0] = 0
        for other in list(counted):
            now = waiting if other is connection else self.waiting(other)
            if other.closing is not None or now <= self._counted_from:
                del counted[other]
            else:
                counted[other] = now
                total[0] += now
        return total[0] > limit

    def waiting(self, connection: Connection) -> int:
        """Bytes waiting for ``connection``: in its transport or queue, or behind its replay."""
        return self.buffered(connection) + connection.backlog_bytes

    def forget(self, connection: Connection) -> None:
        """The connection is gone: it counts for its id no more."""
        if not self._behind or connection.listener_id is None:
            return
        behind = self._behind.get(connection.listener_id)
        if behind is None:
            return
        counted, total = behind
        total[0] -= counted.pop(connection, 0)
        if not counted:
            del self._behind[connection.listener_id]

    def _end_step(self) -> None:
        """Write what each connection was sent after its first frame of the step, in one go.

        Called soon (``call_soon``) after the step's first write: before whatever the step
        woke, and, when the consumer yields in the middle of a batch, before other tasks run."""
        self._step_ends = None
        self._step += 1
        holding, self._holding = self._holding, []
        for connection in holding:
            self.release(connection)

    def release(self, connection: Connection) -> None:
        """Write a connection's held frames now (before anything written to it another way)."""
        held = connection.held
        if held is None:
            return
        connection.held = None
        connection.held_bytes = 0
        transport = connection.transport
        if transport is not None and not transport.is_closing():
            transport.write(b"".join(held))

    def bound_kernel_buffer(self, transport: asyncio.Transport) -> None:
        """Fix a websocket's kernel send buffer to a quarter of ``max_buffered_bytes`` (at most
        256 KiB; Linux doubles it). Left to autotune, it grew to ``tcp_wmem``'s maximum (4 MiB
        by default) for a client that stopped reading before the transport's buffer, the one
        ``max_buffered_bytes`` bounds, held a byte: 1 MiB meant 5 MiB waiting, and a replay was
        written into it at once rather than as fast as the client reads."""
        raw = transport.get_extra_info("socket")
        if raw is None or raw.family not in (AF_INET, AF_INET6):
            return
        size = max(4_096, min(self.max_buffered_bytes // 4, KERNEL_BUFFER_MAX))
        try:
            raw.setsockopt(SOL_SOCKET, SO_SNDBUF, size)
        except OSError:  # closed meanwhile: the write below finds out
            pass

    def write_alert(self, connection: Connection, encoded: bytes) -> None:
        """Send a last packet to a connection being closed, ahead of anything waiting."""
        self.release(connection)
        self._send(connection, encoded, None, None)

    def buffered(self, connection: Connection) -> int:
        """Bytes written to this connection that its client has not taken yet."""
        socket = connection.socket
        if socket is None:  # an SSE stream: its transport, if it started
            transport = connection.transport
            if transport is None:
                return 0
            return transport.get_write_buffer_size() + connection.held_bytes
        transport = connection.transport or socket.transport
        if transport is not None:
            return transport.get_write_buffer_size() + connection.held_bytes
        return socket.queued_bytes

    def begin_replay(self, connection: Connection, packets: list[bytes]) -> None:
        """From now on what is written to ``connection`` waits behind ``packets``."""
        self.release(connection)
        connection.backlog = deque(packets)
        connection.backlog_bytes = 0
        connection.replaying = len(packets)

    async def replay(self, connection: Connection) -> None:
        """Write what :meth:`begin_replay` queued as fast as the client reads it, then what was
        delivered meanwhile, behind it (:attr:`Connection.backlog`).

        Only the latter counts in :attr:`Connection.backlog_bytes` (bounded by
        ``max_buffered_bytes``): the replay itself is bounded by ``recovery.max_replay``, and
        counting it closed as slow (4008) a client reading a replay over ``max_buffered_bytes``
        as fast as it could, as soon as one message was delivered meanwhile."""
        backlog = connection.backlog
        try:
            while backlog and connection.closing is None:
                room = REPLAY_LOW_WATER - self.buffered(connection)
                transport = connection.transport
                while backlog and room > 0:
                    encoded = backlog.popleft()
                    if connection.replaying:
                        connection.replaying -= 1
                    else:
                        connection.backlog_bytes -= len(encoded)
                    if transport is not None:  # a websocket: many frames, one write
                        frame = connection.codec.frame
                        frames = [frame(encoded)]
                        room -= len(frames[0])
                        while backlog and room > 0 and connection.replaying:
                            connection.replaying -= 1
                            frames.append(frame(backlog.popleft()))
                            room -= len(frames[-1])
                        if transport.is_closing():
                            return
                        transport.write(b"".join(frames))
                        continue
                    connection.backlog = None
                    written = self.write(connection, encoded)
                    connection.backlog = backlog
                    if not written:
                        return
                    room = REPLAY_LOW_WATER - self.buffered(connection)
                    transport = connection.transport
                if backlog:
                    await asyncio.sleep(0.005)
        finally:
            connection.backlog = None
            connection.backlog_bytes = connection.replaying = 0
