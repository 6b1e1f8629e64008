"""The inbounds' fast path: the request a gateway is sent most, a POST of a whole JSON message
to an inbound path, answered without aiohttp's request machinery; every other request is
aiohttp's.

aiohttp spends ~50 µs of CPU on a request whose handler does nothing (its parser's message,
header and URL objects, a task, the router, the ``Request`` and ``Response`` objects), about
half of what a one-listener message costs the gateway from its POST to its delivery. A
connection's requests are read here while each is in the commonest form: ``POST`` to a plain
inbound path taking a JSON body, HTTP/1.1, one ``Content-Length`` within ``max_body_size``,
``Content-Type: application/json``, exactly the inbounds' credentials (from an address not
blocked for its failed attempts), no ``Expect``, ``Transfer-Encoding``, ``Content-Encoding``
or ``Upgrade``, no ``Connection`` but ``keep-alive``, every header line well formed. From the
first request that is not, the connection is handed to aiohttp (its ``RequestHandler``, given
the bytes not yet answered), which answers it and the rest as it answers any request: ``401``
for other credentials (``429`` past too many), ``413``, ``400``, ``404``... Answers are the
inbound's own (:func:`.inbound.message_handler`), so a message means the same, with the same
statuses, logs and metrics, on either path.

Only public API: ``web.Server`` is the protocol factory aiohttp hands to ``create_server``, and
its ``RequestHandler`` an ``asyncio.Protocol``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
from collections.abc import Mapping
from email.utils import formatdate
from typing import Final, NamedTuple

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE

from .accepted import Accepted
from .inbound import AcceptJson
from .inbound_auth import FailedAttempts, client_address

logger = logging.getLogger("bow_gateway.http")


class FastRoute(NamedTuple):
    """A plain JSON inbound: what takes its bodies, the ``Authorization`` header value its
    credentials make (compared whole), and the failed attempts of :class:`.inbound_auth.BasicAuth`
    (a blocked address's requests are aiohttp's, which answers them ``429``)."""

    accept_json: AcceptJson
    authorization: bytes
    attempts: FailedAttempts | None = None


MAX_HEAD: Final = 8_190
"""A request's line and headers, in bytes, past which it is aiohttp's (which refuses it)."""
MAX_PENDING: Final = 262_144
"""Bytes of further requests read while one is answered, past which reading pauses."""

# The request line and headers, strictly (RFC 9112's tokens; a value of visible characters,
# spaces and tabs); anything else is aiohttp's to parse and refuse.
_HEAD: Final = re.compile(
    rb"POST (/[!-~]*) HTTP/1\.1\r\n((?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*\r\n)*)"
)
_FIELD: Final = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([^\r]*)\r\n")
# Receipts' headers too: rare, so the fast path leaves them to the inbound's handler.
_HANDED: Final = frozenset(
    {
        b"expect",
        b"transfer-encoding",
        b"content-encoding",
        b"upgrade",
        b"bow-receipt",
        b"bow-fallback",
    }
)
_ONCE: Final = frozenset(
    {b"content-length", b"content-type", b"authorization", b"connection", b"idempotency-key"}
)


class FastPathServer:
    """The protocol factory of a listening socket: a :class:`FastConnection` per connection,
    handed to ``server`` (aiohttp's) when a request is not for the fast path. A fast connection
    with no request to answer is closed ``timeout`` s after its start or last answer, as
    aiohttp's keep-alive timer closes its own; a body that does not arrive with its head is
    aiohttp's to wait for (and time: ``408``)."""

    def __init__(
        self,
        server: web.Server,
        routes: Mapping[bytes, FastRoute],
        *,
        timeout: float = 10.0,
        max_body_size: int = 1_048_576,
    ) -> None:
        self.server = server
        self.routes = dict(routes)
        self.timeout = timeout
        self.max_body_size = max_body_size
        self.connections: set[FastConnection] = set()
        self.closing = False

    def __call__(self) -> FastConnection:
        return FastConnection(self)

    def close(self) -> None:
        """Close the idle connections now, the others once their request is answered."""
        self.closing = True
        for connection in list(self.connections):
            if connection.task is None:
                connection.close()


class FastConnection(asyncio.Protocol):
    """One connection, while its requests are for the fast path (see the module's docstring)."""

    __slots__ = ("_buffer", "_eof", "_fast", "_paused", "_timer", "_transport", "since", "task")

    def __init__(self, fast: FastPathServer) -> None:
        self._fast = fast
        self._transport: asyncio.Transport | None = None
        self._buffer = b""
        self._paused = False
        self._eof = False
        self._timer: asyncio.TimerHandle | None = None  # its keep-alive timer
        self.task: asyncio.Task[None] | None = None
        self.since = 0.0  # when it opened or last answered: its next request's head is due

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        loop = asyncio.get_running_loop()
        self.since = loop.time()
        self._timer = loop.call_at(self.since + self._fast.timeout, self._expire)
        self._fast.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._fast.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        """Close the connection ``timeout`` s after its start or last answer unless a request
        is being answered; one timer a connection, moved on only when it fires (as aiohttp's
        keep-alive timer), not for every request."""
        loop = asyncio.get_running_loop()
        now, timeout = loop.time(), self._fast.timeout
        if self.task is None and now >= self.since + timeout:
            self._timer = None
            self.close()
            return
        due = now + timeout if self.task is not None else self.since + timeout
        self._timer = loop.call_at(due, self._expire)

    def data_received(self, data: bytes) -> None:
        self._buffer = self._buffer + data if self._buffer else data
        if self.task is None:
            self._next()
        elif len(self._buffer) > MAX_PENDING and not self._paused and self._transport:
            self._paused = True
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        self._eof = True
        return self.task is not None  # keep the transport open to answer the request

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _next(self) -> None:
        """Answer the first request buffered if it is whole; hand the connection to aiohttp if
        it is not for the fast path."""
        fast, buffer = self._fast, self._buffer
        end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
        if end < 0:
            if len(buffer) > MAX_HEAD or self._eof:
                self._hand_off()
            return
        head = _HEAD.match(buffer, 0, end + 2)
        route = fast.routes.get(head[1]) if head is not None and head.end() == end + 2 else None
        if head is None or route is None:
            self._hand_off()
            return
        length = -1
        authorization = content_type = key = None
        seen: set[bytes] = set()
        for name, value in _FIELD.findall(head[2]):
            name = name.lower()
            if name in _ONCE:
                if name in seen:
                    self._hand_off()
                    return
                seen.add(name)
                value = value.rstrip(b" \t")  # a greedy match keeps them: faster than a lazy one
                if name == b"content-length":
                    length = int(value) if value.isdigit() and len(value) < 16 else -1
                elif name == b"content-type":
                    content_type = value
                elif name == b"authorization":
                    authorization = value
                elif name == b"idempotency-key":
                    key = value.decode("latin-1")
                elif value.lower() != b"keep-alive":  # Connection
                    length = -1
                    break
            elif name in _HANDED:
                length = -1
                break
        if (
            length < 0
            or length > fast.max_body_size
            or content_type is None
            or content_type.lower() != b"application/json"
            or not hmac.compare_digest(authorization or b"", route.authorization)
            or (route.attempts is not None and route.attempts.blocked and self._blocked(route))
        ):
            self._hand_off()
            return
        start = end + 4
        if len(buffer) - start < length:  # aiohttp's: it times the rest (408) as the inbound says
            self._hand_off()
            return
        self._buffer = buffer[start + length :]
        body = buffer[start : start + length]
        self.task = asyncio.get_running_loop().create_task(self._answer(route, body, key))

    def _blocked(self, route: FastRoute) -> bool:
        """Whether this client's address is blocked for its failed attempts (only asked while
        some address is)."""
        assert route.attempts is not None and self._transport is not None
        address = client_address(self._transport.get_extra_info("peername"))
        return route.attempts.retry_after(address) is not None

    async def _answer(self, route: FastRoute, body: bytes, key: str | None) -> None:
        try:
            answer = _no_content(await route.accept_json(body, key))
        except web.HTTPException as error:
            answer = _refusal(error)
        except Exception:
            logger.exception("the inbound failed")
            answer = _refusal(web.HTTPInternalServerError())
        self.task = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(answer)
        self.since = asyncio.get_running_loop().time()
        if self._fast.closing or self._eof:
            transport.close()
            return
        if self._paused:
            self._paused = False
            transport.resume_reading()
        if self._buffer:
            self._next()

    def _hand_off(self) -> None:
        """The connection becomes aiohttp's, with what it sent that is not answered yet."""
        transport = self._transport
        self._fast.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if transport is None or transport.is_closing():
            return
        handler = self._fast.server()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self._paused:
            transport.resume_reading()
        data, self._buffer, self._transport = self._buffer, b"", None
        if data:
            handler.data_received(data)
        if self._eof:
            handler.eof_received()


def _no_content(accepted: Accepted | None) -> bytes:
    if accepted is None:
        return b"HTTP/1.1 204 No Content\r\n" + _common_headers() + b"\r\n"
    return accepted.head() + _common_headers() + b"\r\n"


def _refusal(error: web.HTTPException) -> bytes:
    body = error.text.encode() if error.text is not None else b""
    lines = [f"HTTP/1.1 {error.status} {error.reason}\r\n"]
    lines += [
        f"{name}: {value}\r\n" for name, value in error.headers.items() if name != "Content-Length"
    ]
    lines.append(f"Content-Length: {len(body)}\r\n")
    if error.status == 408 or error.keep_alive is False:
        lines.append("Connection: close\r\n")
    return "".join(lines).encode("latin-1") + _common_headers() + b"\r\n" + body


_date: list[tuple[int, bytes]] = [(0, b"")]


def _common_headers() -> bytes:
    """``Date`` (made once a second) and ``Server``, as aiohttp sends them."""
    now = int(time.time())
    second, headers = _date[0]
    if second != now:
        date = formatdate(now, usegmt=True)
        headers = f"Date: {date}\r\nServer: {SERVER_SOFTWARE}\r\n".encode()
        _date[0] = (now, headers)
    return headers
