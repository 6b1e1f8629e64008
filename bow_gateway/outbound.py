"""The Socket.IO outbound: versioned handshakes, token authentication, and delivery to sockets.

Sockets connect with ``?v=VERSION``, emit ``authenticate`` with a token and an acknowledgement,
and are then held in the criteria index of their outbound's middleware version. Each message is
resolved once, framed once, and the same bytes are written to every matching websocket without a
task, a queue or an encoding per recipient (long-polling sockets go through engineio's queue).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final
from urllib.parse import parse_qs

import socketio
from engineio import packet as eio_packet

from .criteria import ID_KEY, Criteria, ListenerId, validate_criteria, validate_listener_details
from .index import CriteriaIndex
from .message import DISCONNECT, CriteriaEvent, Event, MessageEvent, dumps
from .metrics import Metrics
from .plugins import CreateCriteriaFromListenerDetails, OutboundPlugin, WatchesCriteria
from .ratelimit import rate_limited
from .seams import LeanSocket, socketio_server, websocket_frame
from .userfn import call_user_function, describe

# A line or two per connection: rate-limited, since clients choose how many connections to open
logger = rate_limited("bow_gateway.outbound", rate=50.0, burst=500.0)

YIELD_EVERY: Final = 1_000  # sockets written between two yields to the event loop


def normalise_version(version: str) -> str:
    """The key that matches ``"v1.3"`` and ``"1.3"`` to the same version, as in Bow (only a key:
    errors, logs and metric labels name a version as it was configured)."""
    return version.removeprefix("v")


class Connection:
    """One Socket.IO connection, from connect to disconnect."""

    __slots__ = (
        "authenticating",
        "closing",
        "details",
        "eio_sid",
        "listener_id",
        "outbound",
        "sid",
        "transport",
    )

    def __init__(self, sid: str, eio_sid: str, outbound: OutboundPlugin) -> None:
        self.sid = sid
        self.eio_sid = eio_sid
        self.outbound = outbound
        self.listener_id: ListenerId | None = None
        self.details: Mapping[str, Any] | None = None  # kept if the middleware watches changes
        self.authenticating = False
        self.closing: str | None = None  # why the gateway is closing it (refused, slow, ...)
        # Set once the socket is a websocket (LeanSocket.transport): frames are written to it.
        self.transport: asyncio.Transport | None = None


class SocketOutbound:
    """Every Socket.IO connection of one instance, and the delivery of events to them."""

    def __init__(
        self,
        *,
        outbounds: Mapping[str, OutboundPlugin],
        middlewares: Mapping[str, CreateCriteriaFromListenerDetails],
        indices: Mapping[str, CriteriaIndex[Connection]],
        publish: Callable[[Event], Awaitable[None]],
        auth_timeout: float = 5.0,
        max_buffered_bytes: int = 1_048_576,
        max_incoming_bytes: int = 16_384,
        body_timeout: float = 10.0,
        transports: list[str] | None = None,
        cors_origins: list[str] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._outbounds = outbounds
        self._middlewares = middlewares
        self._indices = indices
        self._publish = publish
        self._auth_timeout = auth_timeout
        self._max_buffered_bytes = max_buffered_bytes
        self.metrics = metrics or Metrics()
        self.connections: dict[str, Connection] = {}
        self.connects = 0  # Socket.IO connections accepted so far
        self.open_connections = 0  # Engine.IO connections open, authenticated or not
        self._tasks: set[asyncio.Task[None]] = set()
        self._refreshes: dict[str, int] = {}  # per middleware version: refreshes begun
        # Engine.IO connections not authenticated yet, and when they must be
        self._deadlines: dict[str, asyncio.TimerHandle] = {}
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
        versions = parse_qs(environ.get("QUERY_STRING", "")).get("v")
        if not versions or not versions[0]:
            raise _refused(
                sid, "no outbound version: connect with the query parameter v, e.g. ?v=1"
            )
        outbound = self._outbounds.get(normalise_version(versions[0]))
        if outbound is None:
            known = ", ".join(sorted(o.version for o in self._outbounds.values())) or "none"
            asked = versions[0][:64]
            raise _refused(sid, f"unknown outbound version {asked!r}: this gateway serves {known}")
        eio_sid = self.sio.manager.eio_sid_from_sid(sid, "/")
        connection = Connection(sid, eio_sid, outbound)
        self.connections[sid] = connection
        self.connects += 1
        self.metrics.sockets_connected.labels(outbound.version).inc()
        logger.info(
            "socket %s connected to outbound %s from %s",
            sid,
            outbound.version,
            environ.get("REMOTE_ADDR", "?"),
        )
        _forget_headers(environ)

    async def _refuse_namespace(self, namespace: str, sid: str, *args: Any) -> None:
        raise _refused(
            sid,
            f"unknown namespace {namespace[:64]!r}: this gateway serves only the default "
            "namespace '/'",
        )

    async def _disconnect(self, sid: str, reason: Any = None) -> None:
        connection = self.connections.pop(sid, None)
        if connection is None:
            return
        version = connection.outbound.version
        self.metrics.sockets_connected.labels(version).dec()
        if connection.listener_id is not None:
            self.metrics.sockets_authenticated.labels(version).dec()
            index = self._indices[connection.outbound.middleware_version]
            index.remove(connection, connection.listener_id)
        why = connection.closing or str(reason or "transport close")
        connection.closing = why  # a delivery under way skips it from now on
        self.metrics.disconnects.labels(why).inc()
        logger.info("socket %s disconnected: %s", sid, why)
        socket = self.sio.eio.sockets.get(connection.eio_sid)
        if socket is not None and not (socket.closing or socket.closed):
            # The client left the namespace but kept the connection, which serves nothing now.
            self.spawn(self._close_transport(connection.eio_sid))

    def opened(self, eio_sid: str) -> None:
        """An Engine.IO connection opened: it has ``auth_timeout`` to be authenticated."""
        self.open_connections += 1
        self.metrics.connections_open.inc()
        loop = asyncio.get_running_loop()
        self._deadlines[eio_sid] = loop.call_later(self._auth_timeout, self._expire, eio_sid)

    def closed(self, eio_sid: str) -> None:
        self.open_connections -= 1
        self.metrics.connections_open.dec()
        deadline = self._deadlines.pop(eio_sid, None)
        if deadline is not None:
            deadline.cancel()

    def _expire(self, eio_sid: str) -> None:
        """Close a connection not authenticated in time, whatever it did or did not send."""
        self._deadlines.pop(eio_sid, None)
        sid = self.sio.manager.sid_from_eio_sid(eio_sid, "/")
        connection = self.connections.get(sid) if sid is not None else None
        if connection is None:  # Engine.IO only, refused, or the namespace left
            self.metrics.disconnects.labels("timeout").inc()
            self.spawn(self._close_transport(eio_sid))
        elif connection.listener_id is None and connection.closing is None:
            reason = f"not authenticated within {self._auth_timeout:g} s of connecting"
            self.metrics.authentications.labels(connection.outbound.version, "timeout").inc()
            connection.closing = "timeout"  # now: an authentication ending meanwhile must see it
            self.spawn(self._alert_and_close(connection, reason))

    async def refuse(self, sid: str, reason: str, kind: str = "refused") -> None:
        """Tell one socket why with an ``alert``, then disconnect it (``kind`` is for metrics)."""
        connection = self.connections.get(sid)
        if connection is None or connection.closing is not None:
            return
        connection.closing = kind
        await self._alert_and_close(connection, reason)

    async def _alert_and_close(self, connection: Connection, reason: str) -> None:
        logger.info("refusing socket %s: %s", connection.sid, reason)
        await self.sio.emit("alert", reason, to=connection.sid)
        await self.sio.disconnect(connection.sid)
        await self._close_transport(connection.eio_sid)

    async def refuse_eio(self, eio_sid: str, reason: str) -> None:
        sid = self.sio.manager.sid_from_eio_sid(eio_sid, "/")
        if sid is not None and sid in self.connections:
            await self.refuse(sid, reason, "malformed")
        else:
            await self._close_transport(eio_sid)

    async def _close_transport(self, eio_sid: str, *, abort: bool = False) -> None:
        """Close one Engine.IO connection without waiting on its client (:meth:`LeanSocket.shut`).

        A websocket is closed from this side once CLOSE is written, rather than left for the
        client to close: otherwise, during ``stop()``, the web server waited out its whole
        shutdown timeout on the websocket's handler.
        """
        socket: LeanSocket | None = self.sio.eio.sockets.get(eio_sid)
        if socket is not None:
            await socket.shut(abort=abort)

    # -- authentication ---------------------------------------------------------------------

    async def authenticate(self, sid: str, eio_sid: str, args: list[Any], ack_id: Any) -> None:
        """Turn a token into listener details, then criteria, then index the socket."""
        connection = self.connections.get(sid)
        if connection is None or connection.authenticating or connection.listener_id is not None:
            return  # gone, busy, or already authenticated: ignored, as the contract says
        if ack_id is None or not args or args[0] is None or args[0] == "":
            self.metrics.authentications.labels(connection.outbound.version, "refused").inc()
            what = "an acknowledgement callback" if ack_id is None else "a token"
            await self.refuse(sid, f"authenticate needs {what}")
            return
        connection.authenticating = True
        outbound = connection.outbound
        version = outbound.middleware_version
        refreshes = self._refreshes.get(version, 0)
        try:
            details, criteria = await self._criteria_for(outbound, args[0])
        except _Refusal as refusal:
            self.metrics.authentications.labels(outbound.version, "refused").inc()
            await self.refuse(sid, str(refusal))
            return
        finally:
            connection.authenticating = False
        if self.connections.get(sid) is not connection or connection.closing is not None:
            return  # disconnected (or timed out) while the user's functions ran
        deadline = self._deadlines.pop(eio_sid, None)
        if deadline is not None:
            deadline.cancel()
        listener_id = details["id"]
        connection.listener_id = listener_id
        if isinstance(self._middlewares[outbound.middleware_version], WatchesCriteria):
            connection.details = details  # to recompute the criteria when they change
        self._indices[outbound.middleware_version].add(connection, listener_id, criteria)
        self.metrics.authentications.labels(outbound.version, "accepted").inc()
        self.metrics.sockets_authenticated.labels(outbound.version).inc()
        logger.info("socket %s authenticated as listener %r", sid, listener_id)
        await self.sio.send_ack(eio_sid, ack_id)
        if self._refreshes.get(version, 0) != refreshes:
            # The middleware announced a change while these criteria were read (and skipped
            # this listener, not indexed yet): they may be stale, read them again.
            await self.refresh(version, [listener_id])
            criteria = self._indices[version].criteria_of(listener_id) or criteria
        try:
            await self._publish(CriteriaEvent(version, listener_id, criteria))
        except Exception as error:  # noqa: BLE001 - the socket is served here all the same
            logger.warning("could not share the criteria of listener %r: %s", listener_id, error)

    async def _criteria_for(
        self, outbound: OutboundPlugin, token: Any
    ) -> tuple[Mapping[str, Any], Criteria]:
        timeout = self._auth_timeout
        listener_fn = outbound.create_listener_details_from_token
        try:
            details = validate_listener_details(
                await call_user_function(listener_fn, token, timeout)
            )
        except TimeoutError:
            raise _Refusal(f"{describe(listener_fn)} did not answer within {timeout:g} s") from None
        except Exception as error:  # noqa: BLE001 - a refusal, whatever the user's code raised
            raise _Refusal(f"the token was refused: {error}") from None
        listener_id = details["id"]
        criteria_fn = self._middlewares[outbound.middleware_version]
        try:
            raw = await call_user_function(criteria_fn, details, timeout)
        except TimeoutError:
            raise _Refusal(f"{describe(criteria_fn)} did not answer within {timeout:g} s") from None
        except LookupError as error:  # the middleware does not know this listener: say so
            logger.info("%s refused listener %r: %s", describe(criteria_fn), listener_id, error)
            raise _Refusal(str(error)) from None
        except Exception:
            logger.exception("%s raised for listener %r", describe(criteria_fn), listener_id)
            raise _Refusal(f"no criteria could be built for listener {listener_id!r}") from None
        try:
            return details, validate_criteria(raw, listener_id)
        except ValueError as error:
            raise _Refusal(f"invalid criteria for listener {listener_id!r}: {error}") from None

    async def refresh(
        self, middleware_version: str, listener_ids: list[ListenerId] | None = None
    ) -> int:
        """Recompute the criteria of held listeners (all, or those named) and re-index them.

        Nobody is disconnected: a listener whose criteria can no longer be built keeps only
        ``__id``, so it stops receiving what its old criteria matched. Returns how many changed.
        """
        self._refreshes[middleware_version] = self._refreshes.get(middleware_version, 0) + 1
        index = self._indices[middleware_version]
        criteria_fn = self._middlewares[middleware_version]
        changed = 0
        held = index.listener_ids() if listener_ids is None else listener_ids
        for position, listener_id in enumerate(held, 1):
            details = next(
                (c.details for c in index.sockets_of(listener_id) if c.details is not None), None
            )
            if details is None:
                continue  # not held here
            try:
                raw = await call_user_function(criteria_fn, details, self._auth_timeout)
                criteria = validate_criteria(raw, listener_id)
            except Exception as error:  # noqa: BLE001 - refused now: keep the socket, not the access
                logger.info("listener %r keeps no criteria: %s", listener_id, error)
                criteria = {ID_KEY: listener_id}
            changed += index.update(listener_id, criteria)
            if position % 100 == 0:
                await asyncio.sleep(0)  # a long refresh must not starve delivery
        return changed

    # -- delivery ---------------------------------------------------------------------------

    async def deliver(self, event: Event) -> None:
        """Apply one backplane event: deliver a message, or take a listener's new criteria."""
        if isinstance(event, CriteriaEvent):
            index = self._indices.get(event.middleware_version)
            if index is not None:
                index.update(event.listener_id, event.criteria)
            return
        if isinstance(event, MessageEvent):
            await self._deliver_message(event)

    async def _deliver_message(self, event: MessageEvent) -> None:
        index = self._indices.get(event.middleware_version)
        if index is None:
            return
        started = time.perf_counter()
        connections = index.resolve(event.message.audience)
        self.metrics.resolution_seconds.observe(time.perf_counter() - started)
        if not connections:
            return
        message = event.message
        if message.name == DISCONNECT:
            for connection in connections:
                connection.closing = "disconnect message"
                await self.sio.disconnect(connection.sid)
                await self._close_transport(connection.eio_sid)
            return
        data = [message.name, message.payload] if message.has_payload else [message.name]
        encoded = b"2" + dumps(data)  # a Socket.IO EVENT on "/", as python-socketio encodes it
        frame = websocket_frame(b"4" + encoded)  # an Engine.IO MESSAGE
        written = 0
        for connection in connections:
            if connection.closing is not None:  # refused or gone meanwhile
                continue
            transport = connection.transport
            if transport is not None:  # the hot path: the same bytes to every websocket
                if transport.is_closing():
                    continue
                if transport.get_write_buffer_size() > self._max_buffered_bytes:
                    self._too_slow(connection, f"{self._max_buffered_bytes} bytes")
                    continue
                transport.write(frame)
            elif not await self._send_queued(connection, encoded, frame):
                continue
            written += 1
            if written % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        self.metrics.deliveries.inc(written)

    async def _send_queued(self, connection: Connection, encoded: bytes, frame: bytes) -> bool:
        """Deliver to a socket not known as a websocket yet: through engineio's queue while it
        is long-polling (or upgrading), else straight to its transport from now on."""
        socket = self.sio.eio.sockets.get(connection.eio_sid)
        if socket is None or socket.closed:
            return False
        transport = getattr(socket, "transport", None)
        if transport is not None:
            connection.transport = transport
            socket.write(frame)
            return True
        if socket.queued_bytes > self._max_buffered_bytes:
            self._too_slow(connection, f"{self._max_buffered_bytes} bytes")
            return False
        await socket.send(eio_packet.Packet(eio_packet.MESSAGE, encoded.decode()))
        return True

    def _too_slow(self, connection: Connection, waiting: str) -> None:
        connection.closing = "slow"  # once: later messages skip it
        self.spawn(self._alert_and_close(connection, f"too slow: {waiting} waiting to be sent"))

    async def close(self) -> None:
        """Close every connection, so that clients reconnect (to another instance).

        Only the transport is closed: a Socket.IO disconnect would tell clients not to come back.
        """
        for task in list(self._tasks):
            task.cancel()
        for connection in list(self.connections.values()):
            connection.closing = "shutdown"
        for deadline in self._deadlines.values():
            deadline.cancel()
        self._deadlines.clear()
        for eio_sid in list(self.sio.eio.sockets):
            await self._close_transport(eio_sid, abort=True)
        await self.sio.shutdown()  # engineio's ping-check task, which would outlive the gateway

    def listener_count(self) -> int:
        return sum(len(index) for index in self._indices.values())


def _refused(sid: str, reason: str) -> socketio.exceptions.ConnectionRefusedError:
    """A refused Socket.IO connect, logged: the client reads ``reason`` in ``connect_error``."""
    logger.info("refusing socket %s at connect: %s", sid, reason)
    return socketio.exceptions.ConnectionRefusedError(reason)


class _Refusal(Exception):
    """Authentication failed; the text is what the client reads in its ``alert``."""


def _forget_headers(environ: Mapping[str, Any]) -> None:
    """Empty the WSGI environ that python-socketio keeps for the socket's life (~1 KB each).

    engineio copies every request header into it, and no one reads it once connected; it is
    emptied in place because engineio's own request handler still holds it.
    """
    if isinstance(environ, dict):
        environ.clear()
