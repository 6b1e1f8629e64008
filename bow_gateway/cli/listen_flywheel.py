"""``bow-gateway listen --protocol flywheel``: a plain WebSocket speaking Flywheel's frames
(docs/flywheel.md), so that what a browser's ``WebSocket`` would see can be watched from a shell.

It binds once (``B {"sessionId", "auth", "subscribe"}``), prints each ``R {topic} {body}`` as
listen prints any event, says the bind's errors and the close code and reason, and re-binds with a
fresh token when asked to (4100 on ``$remote/{sessionId}/rx/alerts``) if it minted the first one.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, Final

import aiohttp

from .. import codes
from .common import stop_on_signals
from .listening import Plan, coded, print_line, say

REFRESH_REQUIRED: Final = 4100
REASONS: Final = {
    code.code: code.reason for code in vars(codes).values() if isinstance(code, codes.Code)
}
"""Each close code's reason word (``4006``: ``disconnect_message``), as protocol 2 names it."""
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
    address = address_of(plan)
    async with aiohttp.ClientSession() as http:
        try:
            websocket = await http.ws_connect(address, timeout=aiohttp.ClientWSTimeout(ws_close=5))
        except aiohttp.WSServerHandshakeError as error:
            say(f"bow-gateway listen: {address} refused the connection: {error.status} {error}")
            return 1
        except (aiohttp.ClientError, OSError) as error:
            say(f"bow-gateway listen: cannot reach {address}: {error or type(error).__name__}")
            return 1
        async with websocket:
            listener = FlywheelListener(websocket, plan, address, str(uuid.uuid4()))
            reading = asyncio.ensure_future(listener.read())
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
            if not reading.done():  # Ctrl-C: stop reading, then close as a client does
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
                return 0
            return reading.result()


class FlywheelListener:
    """One connection: the bind, then every frame the gateway sends, in order."""

    def __init__(
        self, websocket: aiohttp.ClientWebSocketResponse, plan: Plan, address: str, session: str
    ) -> None:
        self.websocket = websocket
        self.plan = plan
        self.address = address
        self.session = session
        self.bound = False  # the first BindResponse came
        self.refused: list[str] = []  # its errors, when the close followed at once
        self.rebinding = False  # a re-bind with a fresh token waits for its response

    async def read(self) -> int:
        """Bind, then print what arrives until the gateway closes: 1 then, whatever the code."""
        request: dict[str, Any] = {"sessionId": self.session}
        if self.plan.token is not None:
            request["auth"] = {"type": "Bearer", "token": self.plan.token}
        request["subscribe"] = list(self.plan.topics or ("#",))
        await self.websocket.send_str("B " + json.dumps(request))
        while True:
            message = await self.websocket.receive()
            if message.type is aiohttp.WSMsgType.TEXT:
                closing = await self.frame(str(message.data))
                if closing is not None:
                    return self.closed(closing)
            elif message.type is not aiohttp.WSMsgType.BINARY:
                return self.closed(message)

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
        say(
            f"listening on {self.address} as session {self.session}; "
            "events appear below as JSON lines (Ctrl-C to stop)"
        )
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
        await self.websocket.send_str("B " + json.dumps({"auth": auth}))

    def closed(self, message: aiohttp.WSMessage) -> int:
        """Say who closed and why, as the close frame says it; the exit status (1)."""
        code = self.websocket.close_code
        reason = str(message.extra or "") if message.type is aiohttp.WSMsgType.CLOSE else ""
        said = " ".join(str(part) for part in ("code", code, REASONS.get(code or 0)) if part)
        if not self.bound:
            why = f"{reason} ({said})" if reason else said
            say(f"bow-gateway listen: {self.address} refused the connection: {why}")
        elif self.refused:
            say(f"bow-gateway listen: authentication refused: {reason or self.refused[0]} ({said})")
        else:
            say(f"bow-gateway listen: closed by the server: {reason or 'no reason'} ({said})")
        return 1


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
