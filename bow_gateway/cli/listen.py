"""``bow-gateway listen``: connect as a listener and print its events.

Protocol 1 (the default) prints ``{"event", "data"}`` per event, as Bow's clients see them. With
``--proto 2`` (docs/protocol-2.md) it asks for the missed messages after ``--since``, prints each
event with its position, the acknowledgement's result, ``__position`` and ``__gap``, alerts with
their code, and re-authenticates with a freshly minted token when asked to (4100), if it minted the
first one."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import socketio

from .clients import json_object, mint, signing_secret
from .common import UsageError, stop_on_signals

REFRESH_REQUIRED = 4100
GATEWAY_EVENTS = ("__position", "__gap")


@dataclass
class Plan:
    """What to connect with: ``proto`` is the handshake's (``None``: not sent), ``token`` the first
    token (``None``: anonymous), ``fresh`` mints a new one (``None``: the token was given)."""

    url: str
    version: str
    token: str | None
    proto: str | None = None
    since: str | None = None
    fresh: Callable[[], str] | None = None

    @property
    def address(self) -> str:
        return f"{self.url}?v={self.version}" + (f"&proto={self.proto}" if self.proto else "")


def listen(args: argparse.Namespace) -> int:
    if args.proto != "2":
        if args.since is not None:
            raise UsageError("--since needs --proto 2")
        if args.anonymous:
            raise UsageError("--anonymous needs --proto 2")
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
    plan = Plan(args.url.rstrip("/"), args.version, token, args.proto, args.since, fresh)
    return asyncio.run(_run_listener(plan))


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

    async def run(self) -> int:
        stop = stop_on_signals()
        self.client.on("*", self.on_event)
        self.client.on("alert", self.on_alert)
        self.client.on("connect_error", self.on_connect_error)
        self.client.on("disconnect", self.on_disconnect)
        address = self.plan.address
        try:
            await self.client.connect(address, transports=["websocket"], wait_timeout=10)
        except socketio.exceptions.ConnectionError as error:
            reason = "; ".join(self.refusal) or str(error)
            print(
                f"bow-gateway listen: {address} refused the connection: {reason}", file=sys.stderr
            )
            return 1
        try:
            await self.authenticate(self.plan.token, self.on_authenticated)
            first = await _first(self.authenticated, self.ended, stop, timeout=30)
            if first is not self.authenticated:
                if stop.is_set():
                    return 0
                reason = "; ".join(self.refusal) or "no answer to 'authenticate'"
                print(f"bow-gateway listen: authentication refused: {reason}", file=sys.stderr)
                return 1
            print(
                f"listening on {address}; events appear below as JSON lines (Ctrl-C to stop)",
                file=sys.stderr,
                flush=True,
            )
            if await _first(self.ended, stop) is stop:
                return 0
            print("bow-gateway listen: disconnected by the server", file=sys.stderr)
            return 1
        finally:
            if self.client.connected:
                await self.client.disconnect()
            self.finish()

    async def authenticate(self, token: str | None, callback: Callable[..., Any]) -> None:
        await self.client.emit("authenticate", token, callback=callback)

    def on_authenticated(self, *result: Any) -> None:
        self.authenticated.set()

    async def on_event(self, event: str, *data: Any) -> None:
        _print_line(_plain_line(event, data))

    async def on_alert(self, *data: Any) -> None:
        message = data[0] if len(data) == 1 else list(data)
        self.refusal.append(str(message))
        print(f"alert: {message}", file=sys.stderr, flush=True)

    async def on_connect_error(self, *data: Any) -> None:
        # The gateway's reason comes as {"message": ...}: print the reason, not the dict.
        self.refusal.extend(
            str(item["message"]) if isinstance(item, dict) and "message" in item else str(item)
            for item in data
        )

    async def on_disconnect(self, *reason: Any) -> None:
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

    async def authenticate(self, token: str | None, callback: Callable[..., Any]) -> None:
        options = {} if self.plan.since is None else {"since": self.plan.since}
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
            print(f"{what}: {line}", file=sys.stderr, flush=True)
        elif not self.warned:
            self.warned = True
            print(
                "bow-gateway listen: the acknowledgement carried no result: this gateway does not "
                "speak protocol 2 (events print as protocol 1's)",
                file=sys.stderr,
                flush=True,
            )

    async def on_event(self, event: str, *data: Any) -> None:
        if len(data) != 2 or not isinstance(data[1], dict):
            _print_line(_plain_line(event, data))  # not (payload, meta): shown as it came
            return
        payload, meta = data
        line: dict[str, Any] = {"event": event, "data": payload}
        line.update((key, value) for key, value in meta.items() if key not in line)
        if event not in GATEWAY_EVENTS:
            line.setdefault("replayed", False)
        position = _position(meta)
        if position is not None:
            self.position = position
            self.positioned = True
        _print_line(line)

    async def on_alert(self, *data: Any) -> None:
        text = data[0] if data else ""
        info = data[1] if len(data) > 1 and isinstance(data[1], dict) else None
        if info is None:
            await super().on_alert(*data)
            return
        code = info.get("code")
        said = f"{text} ({_code(info)}, reconnect: {info.get('reconnect')})"
        if info.get("fatal") is False:
            said += " [not fatal]"
        print(f"alert: {said}", file=sys.stderr, flush=True)
        if code != REFRESH_REQUIRED:
            self.refusal.append(said)
        elif self.plan.fresh is None:
            print(
                "bow-gateway listen: cannot refresh a token given with --token (--id mints a "
                "fresh one): the gateway ends the socket at the end of the grace",
                file=sys.stderr,
                flush=True,
            )
        else:
            print("bow-gateway listen: re-authenticating with a fresh token", file=sys.stderr)
            await self.client.emit(
                "authenticate", (self.plan.fresh(), {}), callback=self.on_reauthenticated
            )

    async def on_connect_error(self, *data: Any) -> None:
        for item in data:
            if isinstance(item, dict) and "message" in item:
                details = item.get("data")
                coded = f" ({_code(details)})" if isinstance(details, dict) else ""
                self.refusal.append(f"{item['message']}{coded}")
            else:
                self.refusal.append(str(item))

    def finish(self) -> None:
        if self.position is not None:
            print(
                f"bow-gateway listen: last position {self.position} "
                f"(resume with --since {self.position})",
                file=sys.stderr,
                flush=True,
            )


def _plain_line(event: str, data: tuple[Any, ...]) -> dict[str, Any]:
    line: dict[str, Any] = {"event": event}
    if data:
        line["data"] = data[0] if len(data) == 1 else list(data)
    return line


def _print_line(line: dict[str, Any]) -> None:
    print(json.dumps(line, ensure_ascii=False), flush=True)


def _position(mapping: dict[str, Any]) -> str | None:
    position = mapping.get("position")
    return position if isinstance(position, str) else None


def _code(info: dict[str, Any]) -> str:
    """``code 4100 refresh_required``, from an alert's info or a connect_error's data."""
    return " ".join(str(part) for part in ("code", info.get("code"), info.get("reason")) if part)


async def _first(*events: asyncio.Event, timeout: float | None = None) -> asyncio.Event | None:
    """The first of ``events`` to be set (checked in order), or ``None`` on timeout."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return next((event for event in events if event.is_set()), None)
