"""What every protocol served on a plain WebSocket (Flywheel, Gobbler, any protocol built on
:class:`PlainWebSocketEndpoint`) shares: the upgrade (the origin, the handshake limits, the version
asked for), a connection's life in the core from its opening to its end, the one liveness policy
(:mod:`.liveness`), what a client may send (the rule Socket.IO's clients follow, control frames
included: :class:`IncomingFrames`), and the close with a code of section 10. A protocol says what
it does once open and with each text frame; nothing else."""

from __future__ import annotations

import abc
import asyncio
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Final, NamedTuple

from aiohttp import WSMessage, WSMsgType, web

from ..core import codes
from ..core.plugins import OutboundPlugin
from ..runtime.config import Config
from ..runtime.http_server import HandshakeLimits
from ..runtime.ratelimit import TokenBucket
from ..seams.guard import INCOMING_BURST, INCOMING_RATE
from .codec import Codec
from .connection import Connection, logger
from .endpoints import Origins, gone, let_go, pick_version, refusal, take_in, too_busy
from .expiry import Refusal
from .liveness import Pings

if TYPE_CHECKING:
    from .hub import Hub
    from .registry import Handler

MAX_CLOSE_REASON: Final = 123  # bytes of a close frame's reason (RFC 6455 5.5)
CLOSE_WAIT: Final = 1.0  # seconds a closed connection's client has to answer the close


def plain_websocket(max_incoming_bytes: int, close_wait: float) -> web.WebSocketResponse:
    """A plain WebSocket's response, read with :class:`IncomingFrames`: ``autoping=False``, so
    that a client's pings come to it and are counted (aiohttp's own answer would cost a write a
    ping, unbounded); the gateway's own pings are :class:`~.liveness.Pings`'."""
    return web.WebSocketResponse(
        autoping=False,
        compress=False,
        max_msg_size=max_incoming_bytes,
        timeout=close_wait,
    )


class IncomingFrames:
    """What a plain-WebSocket client (Flywheel, Gobbler) sends, held to the rule and the numbers
    of Socket.IO's (:data:`~..seams.guard.INCOMING_BURST` frames at once, then
    :data:`~..seams.guard.INCOMING_RATE` a second; past it, 4011): data frames and control
    frames alike. A ping costs the gateway a pong, a pong a look at the connection's pings: a
    client flooding either is closed as one flooding text frames. Its websocket must be a
    :func:`plain_websocket` (pings are answered here, not by aiohttp)."""

    __slots__ = ("_bucket", "_connection", "_outbound", "_ponged", "_websocket")

    def __init__(
        self,
        outbound: Hub,
        websocket: web.WebSocketResponse,
        connection: Connection,
        ponged: Callable[[], None] | None = None,
    ) -> None:
        self._outbound = outbound
        self._websocket = websocket
        self._connection = connection
        self._ponged = ponged  # what a pong within the rule tells (Flywheel's own pings)
        self._bucket = TokenBucket(INCOMING_RATE, INCOMING_BURST)

    async def next(self) -> WSMessage | None:
        """The client's next text or binary frame within the rule, pings answered and pongs
        told on the way; None once the connection ended (a close, a frame over the size, the
        client gone: what it sent and was not handled yet is dropped). While the gateway closes
        the connection, nothing it sends counts, nor is answered."""
        connection = self._connection
        while True:
            received = await self._websocket.receive()
            kind = received.type
            if kind not in _FRAMES:
                return None  # CLOSE, CLOSING, CLOSED, ERROR (a frame over max_incoming_bytes...)
            if gone(connection):
                return None
            if connection.closing is not None:
                continue
            if not self._bucket.take():
                flooded(self._outbound, connection)
            elif kind is WSMsgType.PING:
                try:
                    await self._websocket.pong(received.data)
                except ConnectionError:
                    return None  # gone while its pong waited for the socket to drain
            elif kind is WSMsgType.PONG:
                if self._ponged is not None:
                    self._ponged()
            else:
                return received


_FRAMES: Final = frozenset({WSMsgType.TEXT, WSMsgType.BINARY, WSMsgType.PING, WSMsgType.PONG})


def flooded(outbound: Hub, connection: Connection) -> None:
    """Close a connection whose client sent frames past :class:`IncomingFrames`' rule: 4011."""
    text = f"over {INCOMING_RATE:g} frames a second ({INCOMING_BURST:g} at once)"
    outbound.close(connection, codes.TOO_MANY_REQUESTS, text)


async def close_websocket(websocket: web.WebSocketResponse, connection: Connection) -> None:
    """Close a WebSocket the gateway ended, with its code and why (1000 when it has none)."""
    code, text = connection.farewell or (1000, "")
    await websocket.close(code=code, message=close_reason(text))


def close_reason(text: str) -> bytes:
    """A close frame's reason: at most 123 bytes of UTF-8, cut on a character boundary."""
    return text.encode()[:MAX_CLOSE_REASON].decode(errors="ignore").encode()


def not_an_upgrade(protocol: str) -> web.Response:
    text = f"the {protocol} outbound takes a WebSocket upgrade (GET with Upgrade: websocket)"
    return refusal(codes.BAD_REQUEST, 400, text)


class Upgraded(NamedTuple):
    """A plain WebSocket opened, and the outbound its client asked for."""

    websocket: web.WebSocketResponse
    plugin: OutboundPlugin


class PlainWebSocketEndpoint(abc.ABC):
    """The handler of ``GET {outbound.{name}_path}`` for a protocol over a plain WebSocket: the
    upgrade, then a :class:`~.connection.Connection` of the protocol's :attr:`codec` in the core,
    pinged (:class:`~.liveness.Pings`), its text frames handed to :meth:`_text` one at a time, in
    order, until it ends. A subclass says what it does once the connection is open
    (:meth:`_start`: authenticate with the handshake's token, or wait for a bind) and with each
    text frame."""

    protocol: ClassVar[str]  # as logs and refusals name it: "Flywheel"
    codec: ClassVar[Codec]  # how delivery frames what it writes to its connections
    strict: ClassVar[bool] = True  # its connections receive only the topics they subscribed to

    def __init__(
        self,
        outbound: Hub,
        limits: HandshakeLimits,
        *,
        max_incoming_bytes: int = 16_384,
        max_publishes_per_second: int = 100,
        cors_origins: list[str] | None = None,
    ) -> None:
        self._outbound = outbound
        self._limits = limits
        self._origins = Origins(cors_origins)
        self._max_incoming_bytes = max_incoming_bytes
        self._max_publishes = max_publishes_per_second
        self._pings = Pings(outbound.spawn)
        self._init_protocol()

    @classmethod
    def serving(cls, hub: Hub, limits: HandshakeLimits, config: Config) -> Handler:
        """The endpoint's handler, with the configuration's settings (a protocol's
        :class:`~.registry.EndpointFactory`)."""
        return cls(
            hub,
            limits,
            max_incoming_bytes=config.max_incoming_bytes,
            max_publishes_per_second=config.max_publishes_per_second,
            cors_origins=config.cors_origins,
        ).handle

    def _init_protocol(self) -> None:  # noqa: B027 (a hook: not every protocol keeps more)
        """What a protocol's endpoint keeps besides: set here, once the settings are."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """``GET`` on the endpoint's path: a connection, for as long as it lasts."""
        upgraded = await self._upgrade(request)
        if not isinstance(upgraded, Upgraded):
            return upgraded
        websocket = upgraded.websocket
        connection = self._open(request, websocket, upgraded.plugin)
        try:
            await self._start(request, connection)
            await self._read(websocket, connection)  # refused: until the close is answered
        finally:
            self._pings.discard(connection)
            self._ended(connection)
            let_go(self._outbound, connection)
        return websocket

    @abc.abstractmethod
    async def _start(self, request: web.Request, connection: Connection) -> None:
        """What the protocol does once the connection is open, before its frames are read."""

    @abc.abstractmethod
    async def _text(self, connection: Connection, text: str) -> None:
        """One text frame of the client's."""

    def _ended(self, connection: Connection) -> None:  # noqa: B027 (a hook, as above)
        """What the protocol forgets of a connection that ended, before the core does."""

    async def _admit(self, connection: Connection, token: str | None) -> bool:
        """Admit the connection with the handshake's token (None: anonymous, where the outbound
        allows it); False when refused (closed with the refusal's code) or gone meanwhile."""
        outbound = self._outbound
        if token is None and connection.outbound.anonymous_criteria is None:
            text = "no token: send Authorization: Bearer or the token query parameter"
            outbound.close(connection, codes.AUTH_REFUSED, text, kind="refused")
            return False
        admission = outbound.admission
        try:
            admitted = await admission.admit(connection, token, keep_details=True)
        except Refusal as refused:
            admission.refuse(connection, refused)
            return False
        if admitted is None:
            return False
        await admission.share(connection, admitted)
        return connection.closing is None

    def _open(
        self, request: web.Request, websocket: web.WebSocketResponse, plugin: OutboundPlugin
    ) -> Connection:
        """The connection of an upgraded WebSocket, in the core (not admitted yet), pinged."""
        outbound = self._outbound
        sid = f"{self.codec.protocol}-{secrets.token_urlsafe(12)}"
        connection = Connection(
            sid,
            sid,
            plugin,
            codec=self.codec,
            authenticates_per_minute=outbound.settings.max_authenticates_per_minute,
        )
        connection.publishes = TokenBucket(self._max_publishes, self._max_publishes)
        connection.transport = request.transport
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        connection.ended = ended
        ended.add_done_callback(lambda _: outbound.spawn(close_websocket(websocket, connection)))
        take_in(outbound, connection)
        if self.strict:
            outbound.topics[plugin.middleware_version].hold_strictly(connection)
        if connection.transport is not None:
            outbound.writer.bound_kernel_buffer(connection.transport)
        self._pings.add(connection)
        logger.info("%s connection %s opened", self.protocol, sid)
        return connection

    async def _read(self, websocket: web.WebSocketResponse, connection: Connection) -> None:
        """Every frame the client sends, in order, until the connection closes: at most
        :class:`IncomingFrames`' rule, pings and pongs included (4011 past it), each handled in a
        step of its own (a client's frames already read never hold the event loop together), none
        once the client has gone (frames read and not handled yet are dropped with it)."""
        pings = self._pings
        incoming = IncomingFrames(
            self._outbound, websocket, connection, lambda: pings.pong(connection)
        )
        while (received := await incoming.next()) is not None:
            if received.type is WSMsgType.TEXT:
                await self._text(connection, received.data)
                await asyncio.sleep(0)
            else:
                self._outbound.close(
                    connection,
                    codes.BAD_REQUEST,
                    f"binary frames are not supported: {self.protocol}'s text frames only",
                    kind="malformed",
                )

    async def _upgrade(self, request: web.Request) -> web.StreamResponse | Upgraded:
        """The WebSocket opened, with the outbound its client asked for; or the answer that
        refuses it (a WebSocket closed with 4xxx once the version is unknown)."""
        refused = self._origins.refuse(request, self.protocol)
        if refused is not None:
            return refused
        why = await self._limits.admit()
        if why is not None:
            return too_busy(why)
        websocket = plain_websocket(self._max_incoming_bytes, CLOSE_WAIT)
        if not websocket.can_prepare(request).ok:
            return not_an_upgrade(self.protocol)
        await websocket.prepare(request)
        plugin, unknown = pick_version(self._outbound, request)
        if plugin is None:
            logger.info("refusing a %s connection: %s", self.protocol, unknown)
            await websocket.close(code=codes.UNKNOWN_VERSION.code, message=close_reason(unknown))
            return websocket
        return Upgraded(websocket, plugin)
