"""``bow-gateway listen``: connect as a listener and print its events.

This module checks the arguments, picks the protocol, and holds the Socket.IO listeners; Flywheel
and SSE are ``listen_flywheel`` and ``listen_sse``. Protocol 1 (the default) prints ``{"event",
"data"}`` per event, as Bow's clients see them. With ``--proto 2`` (docs/protocol-2.md) it
subscribes to ``--topic`` filters, asks for the missed messages after ``--since``, prints each
event with its position, the acknowledgement's result, ``__position`` and ``__gap``, alerts with
their code, re-authenticates with a freshly minted token when asked to (4100), if it minted the
first one, and reconnects, resuming after the last position, when an alert advises reconnecting now
(4012: the instance stops), for up to :data:`PATIENCE` seconds of failed tries."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import socketio

from . import listen_flywheel, listen_sse
from .clients import json_object, mint, signing_secret
from .common import StdoutClosed, UsageError, stop_on_signals
from .listening import (
    DEFAULT_PATHS,
    FIRST_DELAY,
    MAX_DELAY,
    PATIENCE,
    Plan,
    RecentIds,
    coded,
    first_of,
    print_line,
    reconnects_now,
    say,
)

REFRESH_REQUIRED = 4100
GATEWAY_EVENTS = ("__position", "__gap")


def listen(args: argparse.Namespace) -> int:
    protocol: str = args.protocol
    topics = tuple(args.topic or ())
    _check_protocol_options(args, protocol, topics)
    if args.ttl is not None and args.id is None:
        raise UsageError("--ttl needs --id (it sets the minted token's exp)")
    if args.ttl is not None and args.ttl < 1:
        raise UsageError("--ttl must be a positive number of seconds (at least 1)")
    fresh: Callable[[], str] | None = None
    token: str | None
    if args.anonymous:
        if args.token is not None or args.id is not None or args.criteria is not None:
            raise UsageError(
                "--anonymous authenticates without a token: no --token, --id, --criteria"
            )
        token = None
    elif args.token is not None:
        if args.id is not None or args.criteria is not None:
            raise UsageError("give --token, or --id (and --criteria), not both")
        token = args.token
    elif args.id is not None:
        criteria = json_object(args.criteria, "--criteria") if args.criteria else {}
        ttl = 3600.0 if args.ttl is None else args.ttl
        fresh = functools.partial(mint, args.id, signing_secret(args.secret), criteria, ttl=ttl)
        token = fresh()
    else:
        raise UsageError("give --token TOKEN, or --id ID [--criteria JSON] to mint one")
    path = args.path or DEFAULT_PATHS.get(protocol, "")
    plan = Plan(
        args.url.rstrip("/"), args.version, token, args.proto, args.since, fresh, protocol, topics
    )
    plan.path = path if path.startswith("/") else f"/{path}"
    if protocol == "flywheel":
        return asyncio.run(listen_flywheel.run(plan))
    if protocol == "sse":
        return asyncio.run(listen_sse.run(plan))
    return asyncio.run(_run_listener(plan))


def _check_protocol_options(
    args: argparse.Namespace, protocol: str, topics: tuple[str, ...]
) -> None:
    """The options each protocol takes: positions and anonymity are protocol 2's on Socket.IO,
    ``--proto`` is Socket.IO's only, ``--path`` and ``--since`` are not everyone's."""
    if protocol == "socketio":
        if args.path is not None:
            raise UsageError(
                "--path is the Flywheel or SSE endpoint's: with --protocol flywheel|sse"
            )
        if args.proto != "2":
            if args.since is not None:
                raise UsageError("--since needs --proto 2 (or --protocol sse)")
            if args.anonymous:
                raise UsageError("--anonymous needs --proto 2 (or --protocol flywheel|sse)")
            if topics:
                raise UsageError("--topic needs --proto 2 (protocol 1 has no topic filters)")
        return
    if args.proto is not None:
        raise UsageError(f"--proto is Socket.IO's handshake: not with --protocol {protocol}")
    if protocol == "flywheel" and args.since is not None:
        raise UsageError(
            "--since needs positions: Flywheel has none (use --protocol sse or socketio)"
        )


async def _run_listener(plan: Plan) -> int:
    """Listen until Ctrl-C/SIGTERM (0) or a refusal or disconnection (1), over an HTTP session of
    our own, closed whatever ended it: engineio closes its own only when the client disconnects,
    not when the server does, and the interpreter then warns of an unclosed session."""
    async with aiohttp.ClientSession() as session:
        # handle_sigint=False: python-socketio would otherwise take SIGINT to disconnect by itself.
        client = socketio.AsyncClient(reconnection=False, handle_sigint=False, http_session=session)
        listener = Listener2(client, plan) if plan.proto == "2" else Listener(client, plan)
        return await listener.run()


@dataclass
class Listener:
    """A protocol-1 listener (the handlers of protocol 2 are in ``Listener2``)."""

    client: socketio.AsyncClient
    plan: Plan
    refusal: list[str] = field(default_factory=list)
    authenticated: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    farewell: str = ""
    """Why the server disconnected, as its last fatal alert said (protocol 2's has the code)."""
    stdout_closed: bool = False
    resume: bool = False
    """Reconnect once this session ends: an alert advised it (protocol 2's), or the gateway was
    unreachable while resuming."""

    async def run(self) -> int:
        """The last session's exit status; :class:`StdoutClosed` if that is what ended it (raised
        here: python-socketio would log it from the handler that printed)."""
        stop = stop_on_signals()
        try:
            status = await self.session(stop)
            delay, lost_since = FIRST_DELAY, time.monotonic()
            while self.resume and not (stop.is_set() or self.stdout_closed):
                if time.monotonic() - lost_since > PATIENCE:
                    say(f"bow-gateway listen: no connection for {PATIENCE:g} s: giving up")
                    break
                say(f"bow-gateway listen: reconnecting in {delay:g} s")
                if await first_of(stop, timeout=delay) is stop:
                    return 0
                delay = min(delay * 2, MAX_DELAY)
                self.authenticated.clear()
                self.ended.clear()
                self.refusal.clear()
                self.farewell = ""
                status = await self.session(stop)
                if self.authenticated.is_set():  # it had a session: patience starts again
                    delay, lost_since = FIRST_DELAY, time.monotonic()
        finally:
            self.finish()
        if self.stdout_closed:
            raise StdoutClosed
        return status

    async def session(self, stop: asyncio.Event) -> int:
        self.client.on("*", self.on_event)
        self.client.on("alert", self.on_alert)
        self.client.on("connect_error", self.on_connect_error)
        self.client.on("disconnect", self.on_disconnect)
        address = self.plan.address
        try:
            await self.client.connect(address, transports=["websocket"], wait_timeout=10)
        except socketio.exceptions.ConnectionError as error:
            if self.resume and not self.refusal:  # not refused: not up again yet
                say(f"bow-gateway listen: cannot reach {address}: {error}")
                return 1
            reason = "; ".join(self.refusal) or str(error)
            say(f"bow-gateway listen: {address} refused the connection: {reason}")
            self.resume = False
            return 1
        try:
            refused = await self.subscribe()
            if refused is not None:
                say(f"bow-gateway listen: subscribe refused: {refused}")
                return 1
            await self.authenticate(self.plan.token, self.on_authenticated)
            first = await first_of(self.authenticated, self.ended, stop, timeout=30)
            self.resume = False  # refused, or it must be advised again
            if first is not self.authenticated:
                if stop.is_set() or self.stdout_closed:
                    return 0
                reason = "; ".join(self.refusal) or "no answer to 'authenticate'"
                say(f"bow-gateway listen: authentication refused: {reason}")
                return 1
            say(f"listening on {address}; events appear below as JSON lines (Ctrl-C to stop)")
            if await first_of(self.ended, stop) is stop or self.stdout_closed:
                return 0
            say(f"bow-gateway listen: disconnected by the server: {self.farewell}")
            return 1
        finally:
            if self.client.connected:
                await self.client.disconnect()

    async def subscribe(self) -> str | None:
        """Hold the topic filters before authenticating (protocol 2's); why not, if refused."""
        return None

    async def authenticate(self, token: str | None, callback: Callable[..., Any]) -> None:
        await self.client.emit("authenticate", token, callback=callback)

    def on_authenticated(self, *result: Any) -> None:
        self.authenticated.set()

    async def on_event(self, event: str, *data: Any) -> None:
        self.show(_plain_line(event, data))

    def show(self, line: dict[str, Any]) -> None:
        """Print an event's line; once stdout is closed, end the session."""
        try:
            print_line(line)
        except StdoutClosed:
            self.stdout_closed = True
            self.ended.set()

    async def on_alert(self, *data: Any) -> None:
        message = data[0] if len(data) == 1 else list(data)
        self.refusal.append(str(message))
        self.farewell = str(message)
        say(f"alert: {message}")

    async def on_connect_error(self, *data: Any) -> None:
        # The gateway's reason comes as {"message": ...}: print the reason, not the dict. A
        # plain string is python-socketio's own word for a gateway not reached: no refusal.
        self.refusal.extend(
            str(item["message"]) if isinstance(item, dict) and "message" in item else str(item)
            for item in data
            if not isinstance(item, str)
        )

    async def on_disconnect(self, *reason: Any) -> None:
        if not self.farewell:  # no alert said why: python-socketio's reason, and why no code
            said = " ".join(map(str, reason)) or "no reason"
            coding = "" if self.plan.proto == "2" else " (protocol 1 has no codes: --proto 2 has)"
            self.farewell = said + coding
        self.ended.set()

    def finish(self) -> None:
        """Said on stderr once it ends, whatever ended it."""


class Listener2(Listener):
    """A protocol-2 listener: positions, recovery, codes, re-authentication."""

    def __init__(self, client: socketio.AsyncClient, plan: Plan) -> None:
        super().__init__(client, plan)
        self.position: str | None = plan.since  # the last position received: resume after it
        self.positioned = False  # an event brought a position since this connection opened
        self.warned = False
        self.seen = RecentIds()  # the ids of the messages printed last (section 16)

    async def subscribe(self) -> str | None:
        """Before ``authenticate``, so that a recovery's replay is filtered too."""
        if not self.plan.topics:
            return None
        try:
            ack = await self.client.call("subscribe", {"add": list(self.plan.topics)}, timeout=10)
        except socketio.exceptions.TimeoutError:
            return "no answer to 'subscribe': this gateway takes no topic filters"
        error = ack.get("error") if isinstance(ack, dict) else None
        if isinstance(error, dict):
            return f"{error.get('text')} ({coded(error)})"
        say(f"subscribed: {json.dumps(ack, ensure_ascii=False)}")
        return None

    async def authenticate(self, token: str | None, callback: Callable[..., Any]) -> None:
        if self.resume and self.plan.fresh is not None:
            token = self.plan.fresh()  # the first one may have expired meanwhile
        self.positioned = False
        options = {} if self.position is None else {"since": self.position}
        await self.client.emit("authenticate", (token, options), callback=callback)

    def on_authenticated(self, *result: Any) -> None:
        self.acknowledged("authenticated", result)
        ack = result[0] if result else None
        # Replayed events bring their own positions, and an event received before the ack is newer
        # than its position: only then is the ack's position the one to resume after.
        if isinstance(ack, dict) and not self.positioned and ack.get("recovered") is not True:
            self.position = _position(ack) or self.position
        self.authenticated.set()

    def on_reauthenticated(self, *result: Any) -> None:
        # The re-authentication's position splits old criteria from new: not one to resume after.
        self.acknowledged("re-authenticated", result)

    def acknowledged(self, what: str, result: tuple[Any, ...]) -> None:
        if len(result) == 1 and isinstance(result[0], dict):
            line = json.dumps(result[0], ensure_ascii=False)
            say(f"{what}: {line}")
        elif not self.warned:
            self.warned = True
            say(
                "bow-gateway listen: the acknowledgement carried no result: this gateway does not "
                "speak protocol 2 (events print as protocol 1's)"
            )

    async def on_event(self, event: str, *data: Any) -> None:
        if len(data) != 2 or not isinstance(data[1], dict):
            self.show(_plain_line(event, data))  # not (payload, meta): shown as it came
            return
        payload, meta = data
        message_id = meta.get("id")
        if isinstance(message_id, str) and not self.seen.first(message_id):
            return  # replayed again (a recovery after a reconnect): printed once already
        line: dict[str, Any] = {"event": event, "data": payload}
        line.update((key, value) for key, value in meta.items() if key not in line)
        if event not in GATEWAY_EVENTS:
            line.setdefault("replayed", False)
        position = _position(meta)
        if position is not None:
            self.position = position
            self.positioned = True
        self.show(line)

    async def on_alert(self, *data: Any) -> None:
        text = data[0] if data else ""
        info = data[1] if len(data) > 1 and isinstance(data[1], dict) else None
        if info is None:
            await super().on_alert(*data)
            return
        code = info.get("code")
        said = f"{text} ({coded(info)}, reconnect: {info.get('reconnect')})"
        if info.get("fatal") is False:
            said += " [not fatal]"
        else:
            self.farewell = f"{text} ({coded(info)})"
            self.resume = reconnects_now(info)
        say(f"alert: {said}")
        if code != REFRESH_REQUIRED:
            self.refusal.append(said)
        elif self.plan.fresh is None:
            say(
                "bow-gateway listen: cannot refresh a token given with --token (--id mints a "
                "fresh one): the gateway ends the socket at the end of the grace"
            )
        else:
            say("bow-gateway listen: re-authenticating with a fresh token")
            await self.client.emit(
                "authenticate", (self.plan.fresh(), {}), callback=self.on_reauthenticated
            )

    async def on_connect_error(self, *data: Any) -> None:
        for item in data:
            if isinstance(item, str):
                continue  # python-socketio's own word for a gateway not reached: no refusal
            if isinstance(item, dict) and "message" in item:
                details = item.get("data")
                code = f" ({coded(details)})" if isinstance(details, dict) else ""
                self.refusal.append(f"{item['message']}{code}")
            else:
                self.refusal.append(str(item))

    def finish(self) -> None:
        if self.position is not None:
            say(
                f"bow-gateway listen: last position {self.position} "
                f"(resume with --since {self.position})"
            )


def _plain_line(event: str, data: tuple[Any, ...]) -> dict[str, Any]:
    line: dict[str, Any] = {"event": event}
    if data:
        line["data"] = data[0] if len(data) == 1 else list(data)
    return line


def _position(mapping: dict[str, Any]) -> str | None:
    position = mapping.get("position")
    return position if isinstance(position, str) else None
