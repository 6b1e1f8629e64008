"""The Socket.IO outbound: versioned handshakes, the connections' lifecycle, and delivery.

Sockets connect with ``?v=VERSION`` (and ``proto=2`` to opt in to section 6), authenticate
(:mod:`.authentication`), and are then held in the criteria index of their outbound's middleware
version. Each message is resolved once, encoded once per protocol, and the same bytes are written
to every matching websocket without a task, a queue or an encoding per recipient.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final
from urllib.parse import parse_qs

import socketio

from ..core import codes
from ..core.codes import Code
from ..core.criteria import ListenerId
from ..core.history import History
from ..core.index import CriteriaIndex
from ..core.message import (
    Event,
)
from ..core.plugins import CreateCriteriaFromListenerDetails, OutboundPlugin
from ..core.topic_index import TopicIndex
from ..runtime.metrics import Metrics
from ..seams import LeanSocket, socketio_server
from .admission import Admission
from .authentication import Authenticator
from .codec import socketio_codec
from .connection import Connection, Settings, logger
from .delivery import Delivery
from .publishing import ClientPublish
from .receipts import Receipts
from .replays import Replays
from .sessions import Hold, LetGo, Sessions
from .subscriptions import subscribe
from .topic_replay import TopicHistory
from .writer import Writer

DEFAULT_SETTINGS: Final = Settings()
CLOSE_AFTER: Final = 0.05  # seconds between a fatal alert and the disconnect that follows it
DROP_AFTER: Final = 0.9  # seconds a closed socket's client has to take what waits for it


def normalise_version(version: str) -> str:
    """The key that matches ``"v1.3"`` and ``"1.3"`` to the same version, as in Bow (only a key:
    errors, logs and metric labels name a version as it was configured)."""
    return version.removeprefix("v")


class SocketOutbound:
    """Every Socket.IO connection of one instance, and the delivery of events to them."""

    def __init__(
        self,
        *,
        outbounds: Mapping[str, OutboundPlugin],
        middlewares: Mapping[str, CreateCriteriaFromListenerDetails],
        indices: Mapping[str, CriteriaIndex[Connection]],
        publish: Callable[[Event], Awaitable[object]],
        history: History | None = None,
        settings: Settings = DEFAULT_SETTINGS,
        claim: Callable[[str, str, int], Awaitable[bool]] | None = None,
        release: Callable[[str, str], Awaitable[None]] | None = None,
        hold: Hold | None = None,
        let_go: LetGo | None = None,
        max_incoming_bytes: int = 16_384,
        body_timeout: float = 10.0,
        transports: list[str] | None = None,
        cors_origins: list[str] | None = None,
        metrics: Metrics | None = None,
        client_publish: ClientPublish | None = None,
        topic_history: TopicHistory | None = None,
        receipts: Receipts | None = None,
    ) -> None:
        self._outbounds = outbounds
        self.middlewares = middlewares
        self.indices = indices
        # Per middleware version, the topic filters of its connections (empty: no cost at all)
        self.topics: dict[str, TopicIndex[Connection]] = {
            version: TopicIndex() for version in indices
        }
        self.publish = publish
        # not ``history or ...``: an empty History is falsy (it has a length)
        self.history = history if history is not None else History(lambda position: None)
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.connections: dict[str, Connection] = {}
        self.client_publish = client_publish
        self.receipts = receipts if receipts is not None else Receipts()
        self.topic_history = topic_history
        self.positioned: set[Connection] = set()  # authenticated protocol-2 connections
        self.connects = 0  # Socket.IO connections accepted so far
        self.open_connections = 0  # Engine.IO connections open, authenticated or not
        self._tasks: set[asyncio.Task[None]] = set()
        # Engine.IO connections not authenticated yet, and when they must be
        self.deadlines: dict[str, asyncio.TimerHandle] = {}
        self.sio = socketio_server(
            self,
            transports=transports,
            cors_origins=cors_origins,
            max_incoming_bytes=max_incoming_bytes,
            body_timeout=body_timeout,
        )
        self.sio.on("connect", self._connect)
        self.sio.on("connect", self._refuse_namespace, namespace="*")
        self.sio.on("disconnect", self._disconnect)
        self.writer = Writer(
            self._too_slow,
            max_buffered_bytes=settings.max_buffered_bytes,
            max_buffered_bytes_per_id=settings.max_buffered_bytes_per_id,
            crowded=self._too_slow_together,
        )
        # Flywheel connections by sessionId (what $remote/{sessionId}/rx/... reaches), leased
        self.sessions = Sessions(self.spawn, self.writer.write, hold, let_go)
        self.admission = Admission(self, claim=claim, release=release)
        self.authenticator = Authenticator(self, self.admission)
        self.delivery = Delivery(self)
        self.replays = Replays(self, topic_history)

    @property
    def outbounds(self) -> Mapping[str, OutboundPlugin]:
        """The outbounds served, by normalised version."""
        return self._outbounds

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a per-socket job in the background, keeping a reference until it ends; one that
        fails is logged with its traceback (it concerns one socket: nothing to restart)."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._job_done)

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.error("a socket's job failed", exc_info=error)

    # -- connection lifecycle ---------------------------------------------------------------

    async def _connect(self, sid: str, environ: Mapping[str, Any], auth: Any = None) -> None:
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        versions = query.get("v")
        if not versions or not versions[0]:
            raise _refused(
                sid,
                codes.UNKNOWN_VERSION,
                "no outbound version: connect with the query parameter v, e.g. ?v=1",
            )
        outbound = self._outbounds.get(normalise_version(versions[0]))
        if outbound is None:
            known = ", ".join(sorted(o.version for o in self._outbounds.values())) or "none"
            asked = versions[0][:64]
            raise _refused(
                sid,
                codes.UNKNOWN_VERSION,
                f"unknown outbound version {asked!r}: this gateway serves {known}",
            )
        protos = query.get("proto", ["1"])
        if protos[0] not in ("1", "2"):
            raise _refused(
                sid, codes.BAD_PROTOCOL, f"unknown protocol {protos[0][:16]!r}: proto is 1 or 2"
            )
        eio_sid = self.sio.manager.eio_sid_from_sid(sid, "/")
        connection = Connection(
            sid,
            eio_sid,
            outbound,
            codec=socketio_codec(int(protos[0])),
            socket=self.sio.eio.sockets.get(eio_sid),
            authenticates_per_minute=self.settings.max_authenticates_per_minute,
        )
        self.connections[sid] = connection
        self.connects += 1
        self.metrics.sockets_connected.labels(outbound.version, connection.codec.protocol).inc()
        logger.info(
            "socket %s connected to outbound %s (protocol %s) from %s",
            sid,
            outbound.version,
            protos[0],
            environ.get("REMOTE_ADDR", "?"),
        )
        _forget_headers(environ)

    async def _refuse_namespace(self, namespace: str, sid: str, *args: Any) -> None:
        raise _refused(
            sid,
            codes.BAD_NAMESPACE,
            f"unknown namespace {namespace[:64]!r}: this gateway serves only the default "
            "namespace '/'",
        )

    async def _disconnect(self, sid: str, reason: Any = None) -> None:
        connection = self.connections.pop(sid, None)
        if connection is None:
            return
        version = connection.outbound.version
        self.metrics.sockets_connected.labels(version, connection.codec.protocol).dec()
        self.admission.forget(connection)
        self.topics[connection.outbound.middleware_version].discard(connection)
        why = connection.closing or str(reason or "transport close")
        connection.closing = why  # a delivery under way skips it from now on
        self.metrics.disconnects.labels(why).inc()
        logger.info("socket %s disconnected: %s", sid, why)
        socket = self.sio.eio.sockets.get(connection.eio_sid)
        if socket is not None and not (socket.closing or socket.closed):
            # The client left the namespace but kept the connection, which serves nothing now.
            self.spawn(self.close_transport(connection.eio_sid))

    def opened(self, eio_sid: str) -> None:
        """An Engine.IO connection opened: it has ``auth_timeout`` to be authenticated."""
        self.open_connections += 1
        self.metrics.connections_open.inc()
        loop = asyncio.get_running_loop()
        timeout = self.settings.auth_timeout
        self.deadlines[eio_sid] = loop.call_later(timeout, self._expire, eio_sid)

    def closed(self, eio_sid: str) -> None:
        self.open_connections -= 1
        self.metrics.connections_open.dec()
        deadline = self.deadlines.pop(eio_sid, None)
        if deadline is not None:
            deadline.cancel()

    def _expire(self, eio_sid: str) -> None:
        """Close a connection not authenticated in time, whatever it did or did not send."""
        self.deadlines.pop(eio_sid, None)
        sid = self.sio.manager.sid_from_eio_sid(eio_sid, "/")
        connection = self.connections.get(sid) if sid is not None else None
        if connection is None:  # Engine.IO only, refused, or the namespace left
            self.metrics.disconnects.labels("timeout").inc()
            self.spawn(self.close_transport(eio_sid))
        elif not connection.authenticated and connection.closing is None:
            reason = f"not authenticated within {self.settings.auth_timeout:g} s of connecting"
            self.metrics.authentications.labels(connection.outbound.version, "timeout").inc()
            self.close(connection, codes.AUTH_TIMEOUT, reason, kind="timeout")

    def close(
        self,
        connection: Connection,
        code: Code,
        text: str,
        *,
        kind: str | None = None,
        reconnect: str | None = None,
    ) -> None:
        """Tell one socket why with a fatal ``alert``, then disconnect it (soon, and once)."""
        if connection.closing is not None:
            return
        connection.closing = kind or code.reason  # now: later deliveries and alerts skip it
        connection.farewell = (code.code, text)
        self.metrics.limit_hits.labels(str(code.code)).inc()
        logger.info("closing socket %s: %s: %s", connection.sid, code.reason, text)
        connection.backlog = None  # what waits behind a replay is dropped with the socket
        self.writer.write_alert(connection, connection.codec.alert(code, text, reconnect=reconnect))
        self.spawn(self.disconnect_soon(connection))

    async def disconnect_soon(self, connection: Connection) -> None:
        """Disconnect a socket just alerted; one whose client does not take what it was sent
        within :data:`DROP_AFTER` is cut off, its queue dropped (nothing else waits for it)."""
        await asyncio.sleep(CLOSE_AFTER)  # a long-polling client fetches the alert meanwhile
        if connection.ended is not None:  # SSE, Flywheel: its handler ends it
            if not connection.ended.done():
                connection.ended.set_result(None)
        else:
            await self.sio.disconnect(connection.sid)
            await self.close_transport(connection.eio_sid)
        transport = connection.transport
        if transport is None:
            return
        deadline = asyncio.get_running_loop().time() + DROP_AFTER
        while transport.get_write_buffer_size() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if transport.get_write_buffer_size():
            transport.abort()

    async def refuse_eio(self, eio_sid: str, reason: str) -> None:
        sid = self.sio.manager.sid_from_eio_sid(eio_sid, "/")
        connection = self.connections.get(sid) if sid is not None else None
        if connection is not None:
            self.close(connection, codes.BAD_REQUEST, reason, kind="malformed")
        else:
            await self.close_transport(eio_sid)

    async def flooded(self, eio_sid: str, text: str) -> bool:
        """A websocket's client sent packets past the rate: 4011, as on every protocol; False
        for an Engine.IO connection without a Socket.IO one (the seam aborts it)."""
        sid = self.sio.manager.sid_from_eio_sid(eio_sid, "/")
        connection = self.connections.get(sid) if sid is not None else None
        if connection is None:
            return False
        self.close(connection, codes.TOO_MANY_REQUESTS, text, kind="flood")
        return True

    def acknowledged(self, eio_sid: str, ack_id: int) -> bool:
        """A Socket.IO client acknowledged the message it got under ``ack_id`` (section 17):
        whether that was expected (then it is not counted against the client's packet rate)."""
        sid = self.sio.manager.sid_from_eio_sid(eio_sid, "/")
        connection = self.connections.get(sid) if sid is not None else None
        return connection is not None and self.receipts.acknowledged(connection, ack_id)

    async def close_transport(self, eio_sid: str, *, abort: bool = False) -> None:
        """Close one Engine.IO connection without waiting on its client (:meth:`LeanSocket.shut`).

        A websocket is closed from this side once CLOSE is written, rather than left for the
        client to close: otherwise, during ``stop()``, the web server waited out its whole
        shutdown timeout on the websocket's handler.
        """
        socket: LeanSocket | None = self.sio.eio.sockets.get(eio_sid)
        if socket is not None:
            await socket.shut(abort=abort)

    async def authenticate(self, sid: str, eio_sid: str, args: list[Any], ack_id: Any) -> None:
        """An ``authenticate`` event (:class:`.authentication.Authenticator`)."""
        await self.authenticator.authenticate(sid, eio_sid, args, ack_id)

    def subscribe(self, sid: str, args: list[Any], ack_id: Any) -> None:
        """A ``subscribe`` event (:mod:`.subscriptions`)."""
        connection = self.connections.get(sid)
        if connection is not None:
            subscribe(self, connection, args, ack_id)

    async def replay(self, sid: str, args: list[Any], ack_id: Any) -> None:
        """A ``replay`` event (:mod:`.replays`)."""
        connection = self.connections.get(sid)
        if connection is not None:
            await self.replays.replay(connection, args, ack_id)

    async def refresh(
        self, middleware_version: str, listener_ids: list[ListenerId] | None = None
    ) -> int:
        """Recompute held listeners' criteria after a middleware announced a change."""
        return await self.admission.refresh(middleware_version, listener_ids)

    def _too_slow(self, connection: Connection) -> None:
        limit = self.settings.max_buffered_bytes
        self.close(connection, codes.SLOW, f"over {limit} bytes waiting to be sent")

    def _too_slow_together(self, connection: Connection) -> None:
        limit = self.settings.max_buffered_bytes_per_id
        text = f"the listener's sockets have over {limit} bytes waiting to be sent"
        self.close(connection, codes.SLOW, text)

    async def close_all(self) -> None:
        """Close every connection with 4012, so that clients reconnect (to another instance).

        Only the transport is closed: a Socket.IO disconnect would tell clients not to come back.
        """
        for task in list(self._tasks):
            task.cancel()
        alerted = bool(self.positioned)
        for connection in list(self.connections.values()):
            if connection.closing is None:
                connection.closing = "shutdown"
                connection.farewell = (codes.SHUTDOWN.code, "this instance is stopping")
            if connection.codec.positioned:  # protocol 1 sees a clean close, as in Bow
                self.writer.write_alert(
                    connection, connection.codec.alert(codes.SHUTDOWN, "this instance is stopping")
                )
            self.admission.forget(connection)
        for deadline in self.deadlines.values():
            deadline.cancel()
        self.deadlines.clear()
        if alerted:
            await asyncio.sleep(CLOSE_AFTER)  # long-polling clients fetch their alert meanwhile
        for connection in list(self.connections.values()):
            if connection.ended is not None and not connection.ended.done():
                connection.ended.set_result(None)  # SSE, Flywheel: their handlers end them
        for eio_sid in list(self.sio.eio.sockets):
            await self.close_transport(eio_sid, abort=True)
        await self.sio.shutdown()  # engineio's ping-check task, which would outlive the gateway

    def listener_count(self) -> int:
        return sum(len(index) for index in self.indices.values())


def _refused(sid: str, code: Code, reason: str) -> socketio.exceptions.ConnectionRefusedError:
    """A refused Socket.IO connect, logged: the client reads ``reason`` and ``{code, reason,
    reconnect}`` in ``connect_error``."""
    logger.info("refusing socket %s at connect: %s", sid, reason)
    return socketio.exceptions.ConnectionRefusedError(reason, code.data())


def _forget_headers(environ: Mapping[str, Any]) -> None:
    """Empty the WSGI environ that python-socketio keeps for the socket's life (~1 KB each).

    engineio copies every request header into it, and no one reads it once connected; it is
    emptied in place because engineio's own request handler still holds it.
    """
    if isinstance(environ, dict):
        environ.clear()
