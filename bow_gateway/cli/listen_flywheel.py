"""``bow-gateway listen --protocol flywheel``: a plain WebSocket speaking Flywheel's frames
(docs/flywheel.md), so that what a browser's ``WebSocket`` would see can be watched from a shell.

It binds (``B {"sessionId", "auth", "subscribe"}``), prints each ``R {topic} {body}`` as listen
prints any event, says the bind's errors and the close code and reason, and re-binds with a fresh
token when asked to (4100 on ``$remote/{sessionId}/rx/alerts``) if it minted the first one. A
close whose advice is to reconnect now (4012: the gateway stops) connects and binds again, trying
for up to :data:`PATIENCE` seconds; any other close ends it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Final

import aiohttp

from .common import stop_on_signals
from .listening import (
    CODES,
    FIRST_DELAY,
    MAX_DELAY,
    PATIENCE,
    Plan,
    coded,
    print_line,
    read_until_stopped,
    reconnects_now,
    say,
)

REFRESH_REQUIRED: Final = 4100
REFUSAL_WAIT: Final = 1.0
"""Seconds to wait, after a bind answered with errors, for the close that follows a refused
``auth`` (the gateway sends it right behind the ``BindResponse``)."""


def address_of(plan: Plan) -> str:
    """``ws://host:port/broker?v=v1``: the plan's gateway, as a WebSocket address."""
    url = plan.url.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    return f"{url}{plan.path}?v={plan.version}"


async def run(plan: Plan) -> int:
    """Listen until Ctrl-C/SIGTERM (0), or a refusal or the gateway's close (1)."""
    stop = stop_on_signals()
    async with aiohttp.ClientSession() as http:
        listener = FlywheelListener(http, plan, address_of(plan), str(uuid.uuid4()))
        status = await read_until_stopped(stop, listener.run())
        return 0 if status is None else status


class FlywheelListener:
    """Its connections, one after the other: each one's bind, then every frame, in order."""

    def __init__(self, http: aiohttp.ClientSession, plan: Plan, address: str, session: str) -> None:
        self.http = http
        self.plan = plan
        self.address = address
        self.session = session
        self.token = plan.token
        self.websocket: aiohttp.ClientWebSocketResponse | None = None
        self.listening = False  # a connection was bound once: later ones are reconnections
        self.bound = False  # this connection's first BindResponse came
        self.refused: list[str] = []  # its errors, when the close followed at once
        self.rebinding = False  # a re-bind with a fresh token waits for its response

    async def run(self) -> int:
        """Connect and read until a close; again, after waiting, when its code advises
        reconnecting now; the exit status (1) once a close or :data:`PATIENCE` ends it."""
        delay, lost_since = FIRST_DELAY, time.monotonic()
        while True:
            connected = await self.connect()
            if isinstance(connected, str):  # why not
                if not self.listening or time.monotonic() - lost_since > PATIENCE:
                    say(f"bow-gateway listen: {connected}")
                    return 1
                say(f"bow-gateway listen: {connected}; trying again in {delay:g} s")
            else:
                async with connected:
                    self.websocket, self.bound, self.refused = connected, False, []
                    message = await self.read()
                if not (self.bound and not self.refused and reconnects_now(self.close_info())):
                    return self.closed(message)
                delay, lost_since = FIRST_DELAY, time.monotonic()
                self.say_closed(message, f"; reconnecting in {delay:g} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_DELAY)
            if self.plan.fresh is not None:
                self.token = self.plan.fresh()

    async def connect(self) -> aiohttp.ClientWebSocketResponse | str:
        """A new connection, or why there is none."""
        try:
            return await self.http.ws_connect(
                self.address, timeout=aiohttp.ClientWSTimeout(ws_close=5)
            )
        except aiohttp.WSServerHandshakeError as error:
            return f"{self.address} refused the connection: {error.status} {error}"
        except (aiohttp.ClientError, OSError) as error:
            return f"cannot reach {self.address}: {error or type(error).__name__}"

    async def read(self) -> aiohttp.WSMessage:
        """Bind, then print what arrives until the gateway closes; the close (or error)."""
        assert self.websocket is not None
        request: dict[str, Any] = {"sessionId": self.session}
        if self.token is not None:
            request["auth"] = {"type": "Bearer", "token": self.token}
        request["subscribe"] = list(self.plan.topics or ("#",))
        await self.websocket.send_str("B " + json.dumps(request))
        while True:
            message = await self.websocket.receive()
            if message.type is aiohttp.WSMsgType.TEXT:
                closing = await self.frame(str(message.data))
                if closing is not None:
                    return closing
            elif message.type is not aiohttp.WSMsgType.BINARY:
                return message

    async def frame(self, text: str) -> aiohttp.WSMessage | None:
        """Handle one text frame; the close, if one was read while handling it."""
        kind, _, rest = text.partition(" ")
        if kind == "B":
            return await self.bind_response(rest)
        if kind != "R":
            say(f"bow-gateway listen: an unknown frame: {text[:200]}")
            return None
        topic, _, body = rest.partition(" ")
        direct = f"$remote/{self.session}/rx/"
        value = _body(body)
        if topic == f"{direct}alerts":
            await self.alert(value)
        elif topic == f"{direct}errors":
            for error in value if isinstance(value, list) else [value]:
                say(f"error: {_error(error)}")
        else:
            print_line({"event": topic, "data": value})
        return None

    async def bind_response(self, text: str) -> aiohttp.WSMessage | None:
        response = _body(text)
        found = response.get("errors") if isinstance(response, dict) else None
        errors = [_error(error) for error in found or ()]
        for error in errors:
            say(f"bind error: {error}")
        if self.rebinding:
            self.rebinding = False
            if not errors:
                say("re-authenticated")
            return None
        if self.bound:
            return None
        self.bound = True
        assert self.websocket is not None
        if errors:  # a refused auth is closed right behind its BindResponse: wait for that
            try:
                message = await self.websocket.receive(timeout=REFUSAL_WAIT)
            except TimeoutError:
                pass
            else:
                if message.type is not aiohttp.WSMsgType.TEXT:
                    self.refused = errors
                    return message
                await self.frame(str(message.data))
        if self.listening:
            say(f"bow-gateway listen: bound again on {self.address} as session {self.session}")
        else:
            say(
                f"listening on {self.address} as session {self.session}; "
                "events appear below as JSON lines (Ctrl-C to stop)"
            )
        self.listening = True
        return None

    async def alert(self, info: Any) -> None:
        if not isinstance(info, dict):
            say(f"alert: {info}")
            return
        say(f"alert: {info.get('text')} ({coded(info)}) [not fatal]")
        if info.get("code") != REFRESH_REQUIRED:
            return
        if self.plan.fresh is None:
            say(
                "bow-gateway listen: cannot refresh a token given with --token (--id mints a "
                "fresh one): the gateway closes the connection at the end of the grace"
            )
            return
        say("bow-gateway listen: re-authenticating with a fresh token")
        self.rebinding = True
        auth = {"type": "Bearer", "token": self.plan.fresh()}
        assert self.websocket is not None
        await self.websocket.send_str("B " + json.dumps({"auth": auth}))

    def close_info(self) -> dict[str, Any]:
        """The last connection's close code and its reason word (``4006``:
        ``disconnect_message``), as protocol 2 names it."""
        code = self.websocket.close_code if self.websocket is not None else None
        known = CODES.get(code or 0)
        return {"code": code, "reason": known.reason if known else None}

    def closed(self, message: aiohttp.WSMessage) -> int:
        """Say who closed and why, as the close frame says it; the exit status (1)."""
        reason = _close_reason(message)
        said = coded(self.close_info())
        if not self.bound:
            why = f"{reason} ({said})" if reason else said
            say(f"bow-gateway listen: {self.address} refused the connection: {why}")
        elif self.refused:
            say(f"bow-gateway listen: authentication refused: {reason or self.refused[0]} ({said})")
        else:
            self.say_closed(message)
        return 1

    def say_closed(self, message: aiohttp.WSMessage, then: str = "") -> None:
        reason = _close_reason(message) or "no reason"
        said = coded(self.close_info())
        say(f"bow-gateway listen: closed by the server: {reason} ({said}){then}")


def _close_reason(message: aiohttp.WSMessage) -> str:
    return str(message.extra or "") if message.type is aiohttp.WSMsgType.CLOSE else ""


def _body(text: str) -> Any:
    """An ``R`` frame's body as listen prints it: its JSON value, else the text itself (a string
    payload comes as it is), ``None`` when empty (no payload)."""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _error(error: Any) -> str:
    """A bind or publish error in words: ``TopicAccess 'a/b': why`` or ``General: why``."""
    if not isinstance(error, dict):
        return str(error)
    topic = f" {error['topic']!r}" if "topic" in error else ""
    return f"{error.get('type')}{topic}: {error.get('description')}"
