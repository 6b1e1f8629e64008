"""python-socketio's server and manager, with the seams the gateway needs and they do not offer.

- ``authenticate`` and ``subscribe`` handlers learn whether the client asked for an
  acknowledgement, which the contract requires and python-socketio hides;
- every Engine.IO connection, with a Socket.IO connection or not, is known to the outbound from
  its start (:meth:`ServerHooks.opened`), so that one never authenticated is closed in time;
- a client's acknowledgement reaches the outbound (:meth:`ServerHooks.acknowledged`);
- a malformed packet, or a binary one (the gateway needs none), costs its own socket an ``alert``
  and a disconnect, and nothing else;
- a disconnect costs the same at any number of sockets (:class:`Manager`).
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any, Final, Protocol

import socketio
from socketio import packet as sio_packet

from ..runtime.ratelimit import rate_limited
from .transport import LeanSocket, make_lean
from .transport import logger as transport_logger
from .websocket import WebSocketDriver

_BINARY_TYPES: Final = frozenset(
    {str(sio_packet.BINARY_EVENT), str(sio_packet.BINARY_ACK)}
)  # Socket.IO packets that announce attachments


class ServerHooks(Protocol):
    """What the server tells the outbound, which owns the connections."""

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None: ...

    async def authenticate(self, sid: str, eio_sid: str, args: list[Any], ack_id: Any) -> None: ...

    def subscribe(self, sid: str, args: list[Any], ack_id: Any) -> None: ...

    async def replay(self, sid: str, args: list[Any], ack_id: Any) -> None: ...

    def opened(self, eio_sid: str) -> None: ...

    def closed(self, eio_sid: str) -> None: ...

    async def refuse_eio(self, eio_sid: str, reason: str) -> None: ...

    async def flooded(self, eio_sid: str, text: str) -> bool: ...

    def acknowledged(self, eio_sid: str, ack_id: int) -> bool: ...


class Manager(socketio.AsyncManager):  # type: ignore[misc]
    """python-socketio's manager, with a disconnect that costs the same at any number of sockets.

    Its own looks for the socket in every room of the namespace, and each socket has a room of
    its own: closing 10,000 sockets at once stalled the loop for seconds. Here a socket is only
    ever in the namespace's room (``None``) and its own, so those are the rooms it leaves.
    """

    def basic_disconnect(self, sid: str, namespace: str, **kwargs: Any) -> None:
        for room in (None, sid):
            self.basic_leave_room(sid, namespace, room)
        self.callbacks.pop(sid, None)
        for pending in (self.pending_connect, self.pending_disconnect):
            sids = pending.get(namespace)
            if sids is not None and sid in sids:
                sids.remove(sid)
                if not sids:
                    del pending[namespace]


class Server(socketio.AsyncServer):  # type: ignore[misc]
    """python-socketio's server, telling ``hooks`` what the module docstring lists."""

    def __init__(self, hooks: ServerHooks, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._hooks = hooks

    async def _handle_event(self, eio_sid: str, namespace: str | None, id: Any, data: Any) -> None:
        if not (isinstance(data, list) and data and isinstance(data[0], str)):
            raise ValueError("an event must be a list that starts with the event name")
        if data[0] == "authenticate":
            sid = self.manager.sid_from_eio_sid(eio_sid, namespace or "/")
            if sid is not None and self.manager.is_connected(sid, namespace or "/"):
                self._hooks.spawn(self._hooks.authenticate(sid, eio_sid, data[1:], id))
            return
        if data[0] == "subscribe":  # applied at once, in order with the socket's other packets
            sid = self.manager.sid_from_eio_sid(eio_sid, namespace or "/")
            if sid is not None and self.manager.is_connected(sid, namespace or "/"):
                self._hooks.subscribe(sid, data[1:], id)
            return
        if data[0] == "replay":
            sid = self.manager.sid_from_eio_sid(eio_sid, namespace or "/")
            if sid is not None and self.manager.is_connected(sid, namespace or "/"):
                self._hooks.spawn(self._hooks.replay(sid, data[1:], id))
            return
        # Any other event from a client is ignored: clients only listen.

    async def _handle_ack(self, eio_sid: str, namespace: str | None, id: Any, data: Any) -> None:
        """A client's acknowledgement: of a message that asked for a receipt (the gateway asks
        no other), whatever its arguments; python-socketio's own would warn of an unknown id."""
        if (namespace or "/") == "/" and type(id) is int and self._hooks.acknowledged(eio_sid, id):
            socket = self.eio.sockets.get(eio_sid)
            if isinstance(socket, LeanSocket):
                socket.give_back()  # expected: not counted against the client's packet rate

    async def _handle_eio_connect(self, eio_sid: str, environ: Any) -> None:
        make_lean(self.eio, eio_sid)
        self._hooks.opened(eio_sid)
        await super()._handle_eio_connect(eio_sid, environ)

    async def _handle_eio_disconnect(self, eio_sid: str, reason: Any) -> None:
        self._hooks.closed(eio_sid)
        await super()._handle_eio_disconnect(eio_sid, reason)

    async def _handle_eio_message(self, eio_sid: str, data: Any) -> None:
        try:
            if data[:1] in _BINARY_TYPES:
                raise ValueError("a binary event or ack (this gateway takes no attachments)")
            await super()._handle_eio_message(eio_sid, data)
        except Exception as error:  # noqa: BLE001 - whatever a hostile client sent
            transport_logger.info("malformed packet from %s: %s", eio_sid, error)
            await self._hooks.refuse_eio(eio_sid, f"malformed packet: {error}")

    async def shutdown(self) -> None:
        """Stop engineio's ping-check task, if it runs (engineio's own fails a second time)."""
        if self.eio.service_task_handle is not None:
            await super().shutdown()

    async def send_ack(self, eio_sid: str, id: int) -> None:
        """Acknowledge a client's event on ``/`` with no data."""
        await self._send_packet(
            eio_sid, self.packet_class(sio_packet.ACK, namespace="/", id=id, data=[])
        )


def socketio_server(
    hooks: ServerHooks,
    *,
    transports: list[str] | None = None,
    cors_origins: list[str] | None = None,
    max_incoming_bytes: int = 16_384,
    body_timeout: float = 10.0,
) -> Server:
    """The gateway's Socket.IO server: every namespace (the outbound refuses all but ``/``),
    the lean websocket driver, bounded packets, origins checked, quiet loggers."""
    server = Server(
        hooks,
        async_mode="aiohttp",
        namespaces="*",
        # engineio refuses a request whose Origin header it does not allow (a websocket
        # handshake too); a request without one (not a browser) always passes. None allows the
        # same origin only; never [], which turns the check off.
        cors_allowed_origins=cors_origins or None,
        # With "*", engineio echoes any Origin back: then no cookies (the gateway reads none).
        cors_credentials="*" not in (cors_origins or []),
        transports=transports or ["polling", "websocket"],
        # Their own loggers, at WARNING: at INFO they log every packet with its data (tokens);
        # and never a handler of their own, which writes around the log's format.
        logger=_library_logger("bow_gateway.socketio"),
        engineio_logger=_library_logger("bow_gateway.engineio"),
        max_http_buffer_size=max_incoming_bytes,
        client_manager=Manager(),
    )
    server.eio._async = {**server.eio._async, "websocket": WebSocketDriver}
    server.eio.body_timeout = body_timeout  # LeanSocket's bound on a long-polling POST's body
    server.eio.flooded = hooks.flooded  # what LeanSocket tells of a websocket past the rate
    server.eio.acknowledged = hooks.acknowledged  # LeanSocket's ACKs on "/", told at once
    return server


def _library_logger(name: str) -> logging.Logger:
    """A logger for python-socketio or python-engineio: WARNING and up, rate-limited."""
    library_logger = rate_limited(name)
    library_logger.setLevel(logging.WARNING)
    return library_logger
