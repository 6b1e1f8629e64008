"""Writing to one connection without a task per packet: straight to its websocket, into its
long-poll queue, or behind a replay under way; a socket over its buffer is slow (4008).

A transport's first frame in an event-loop step is written at once; the frames after it in the
same step are held and written together when the step ends (one ``send()`` for a run of
messages read in one batch from the backplane, rather than one each)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from socket import AF_INET, AF_INET6, SO_SNDBUF, SOL_SOCKET
from typing import Final

from .connection import Connection

REPLAY_LOW_WATER: Final = 65_536  # a replay writes on while the socket buffers less than this
KERNEL_BUFFER_MAX: Final = 262_144  # the most of a websocket's send buffer left to the kernel


class Writer:
    """Writes encoded packets to connections (framed by their codec); ``slow(connection)``
    when one is over ``max_buffered_bytes``."""

    def __init__(
        self,
        slow: Callable[[Connection], None],
        *,
        max_buffered_bytes: int = 1_048_576,
    ) -> None:
        self._slow = slow
        self.max_buffered_bytes = max_buffered_bytes
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
            connection.backlog_bytes += len(encoded)
            if connection.backlog_bytes > self.max_buffered_bytes:
                self._slow(connection)
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
                if limit is not None and socket.queued_bytes > limit:
                    self._slow(connection)
                    return False
                return socket.enqueue(encoded.decode())
            transport = connection.transport = socket.transport
            self.bound_kernel_buffer(transport)
        if transport.is_closing():
            return False
        if limit is not None and transport.get_write_buffer_size() + connection.held_bytes > limit:
            self._slow(connection)
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
