"""The commands that try a gateway out: ``token`` (mint a JWT), ``push`` (POST a message) and
``listen`` (connect as a listener and print its events)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

import aiohttp
import socketio

from ..standalone import DEV_INBOUND_PASSWORD, DEV_JWT_SECRET, JWT_SECRET_ENV
from .common import EXAMPLE_CRITERIA, PASSWORD_ENV, UsageError, stop_on_signals

# -- token --------------------------------------------------------------------------------------


def token(args: argparse.Namespace) -> int:
    criteria = _json_object(args.criteria, "--criteria") if args.criteria is not None else {}
    if args.ttl <= 0:
        raise UsageError("--ttl must be a positive number of seconds")
    print(_mint(args.id, _secret(args.secret), criteria, ttl=args.ttl))
    return 0


def _mint(listener_id: str, secret: str, criteria: Mapping[str, Any], ttl: float = 3600) -> str:
    """``bow_gateway.outbounds.jwt.mint``, imported by name: mypy sees the bundled plugins as the
    top-level packages of the repository, not under ``bow_gateway``."""
    jwt_outbound = importlib.import_module("bow_gateway.outbounds.jwt")
    token: str = jwt_outbound.mint(listener_id, secret, criteria=criteria, ttl=ttl)
    return token


def _secret(given: str | None) -> str:
    """The HS256 secret to sign with: ``--secret``, else ``$BOW_JWT_SECRET``, else the development
    one. One too short to be safe (RFC 7518) is a usage error: the gateway would refuse it."""
    jwt_outbound = importlib.import_module("bow_gateway.outbounds.jwt")
    secret = given or os.environ.get(JWT_SECRET_ENV)
    if secret:
        try:
            jwt_outbound.check_secret(secret, source="--secret" if given else f"${JWT_SECRET_ENV}")
        except ValueError as error:
            raise UsageError(str(error)) from None
        return secret
    print(
        f"bow-gateway: signing with the development secret ({JWT_SECRET_ENV} is not set)",
        file=sys.stderr,
    )
    return DEV_JWT_SECRET


# -- push ---------------------------------------------------------------------------------------


def push(args: argparse.Namespace) -> int:
    audience = _json(args.audience, "--audience")
    body: dict[str, Any] = {"name": args.name, "audience": audience}
    if args.payload is not None:
        payload = _json(args.payload, "--payload")
        if args.envelope:
            body["payload"] = payload
        elif not isinstance(payload, dict):
            raise UsageError(
                "--payload must be a JSON object: the pass-through inbound sends the body itself "
                "as the payload (use --envelope to send {name, audience, payload})"
            )
        elif {"name", "audience"} & payload.keys():
            raise UsageError("--payload must not set 'name' or 'audience': use --name, --audience")
        else:
            body.update(payload)
    password = args.password or os.environ.get(PASSWORD_ENV) or DEV_INBOUND_PASSWORD
    return asyncio.run(_post(args.url.rstrip("/") + args.path, args.user, password, body))


async def _post(url: str, user: str, password: str, body: Any) -> int:
    headers = {"Authorization": aiohttp.encode_basic_auth(user, password)}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.post(url, json=body, headers=headers) as response,
        ):
            text = (await response.text()).strip()
    except (aiohttp.ClientError, TimeoutError) as error:
        print(
            f"bow-gateway push: cannot reach {url}: {error or type(error).__name__}",
            file=sys.stderr,
        )
        return 1
    status = f"{response.status} {response.reason}"
    if response.status == 204:
        print(f"{status}: accepted")
        return 0
    print(f"bow-gateway push: {status}" + (f": {text}" if text else ""), file=sys.stderr)
    return 1


# -- listen -------------------------------------------------------------------------------------


def listen(args: argparse.Namespace) -> int:
    if args.token is not None:
        if args.id is not None or args.criteria is not None:
            raise UsageError("give --token, or --id (and --criteria), not both")
        token = args.token
    elif args.id is not None:
        criteria = _json_object(args.criteria, "--criteria") if args.criteria else {}
        token = _mint(args.id, _secret(args.secret), criteria)
    else:
        raise UsageError("give --token TOKEN, or --id ID [--criteria JSON] to mint one")
    return asyncio.run(_run_listener(args.url.rstrip("/"), args.version, token))


async def _run_listener(url: str, version: str, token: str) -> int:
    """Listen until Ctrl-C/SIGTERM (0) or a refusal or disconnection (1), over an HTTP session of
    our own, closed whatever ended it: engineio closes its own only when the client disconnects,
    not when the server does, and the interpreter then warns of an unclosed session."""
    async with aiohttp.ClientSession() as session:
        return await _listen_with(session, url, version, token)


async def _listen_with(session: aiohttp.ClientSession, url: str, version: str, token: str) -> int:
    stop = stop_on_signals()
    # handle_sigint=False: python-socketio would otherwise take SIGINT to disconnect by itself.
    client = socketio.AsyncClient(reconnection=False, handle_sigint=False, http_session=session)
    refusal: list[str] = []
    authenticated = asyncio.Event()
    ended = asyncio.Event()

    async def on_event(event: str, *data: Any) -> None:
        line: dict[str, Any] = {"event": event}
        if data:
            line["data"] = data[0] if len(data) == 1 else list(data)
        print(json.dumps(line, ensure_ascii=False), flush=True)

    async def on_alert(*data: Any) -> None:
        message = data[0] if len(data) == 1 else list(data)
        refusal.append(str(message))
        print(f"alert: {message}", file=sys.stderr, flush=True)

    async def on_connect_error(*data: Any) -> None:
        # The gateway's reason comes as {"message": ...}: print the reason, not the dict.
        refusal.extend(
            str(item["message"]) if isinstance(item, dict) and "message" in item else str(item)
            for item in data
        )

    async def on_disconnect(*reason: Any) -> None:
        ended.set()

    client.on("*", on_event)
    client.on("alert", on_alert)
    client.on("connect_error", on_connect_error)
    client.on("disconnect", on_disconnect)

    address = f"{url}?v={version}"
    try:
        await client.connect(address, transports=["websocket"], wait_timeout=10)
    except socketio.exceptions.ConnectionError as error:
        reason = "; ".join(refusal) or str(error)
        print(f"bow-gateway listen: {address} refused the connection: {reason}", file=sys.stderr)
        return 1
    try:
        await client.emit("authenticate", token, callback=lambda *_: authenticated.set())
        if await _first(authenticated, ended, stop, timeout=30) is not authenticated:
            if stop.is_set():
                return 0
            reason = "; ".join(refusal) or "no answer to 'authenticate'"
            print(f"bow-gateway listen: authentication refused: {reason}", file=sys.stderr)
            return 1
        print(
            f"listening on {address}; events appear below as JSON lines (Ctrl-C to stop)",
            file=sys.stderr,
            flush=True,
        )
        if await _first(ended, stop) is stop:
            return 0
        print("bow-gateway listen: disconnected by the server", file=sys.stderr)
        return 1
    finally:
        if client.connected:
            await client.disconnect()


async def _first(*events: asyncio.Event, timeout: float | None = None) -> asyncio.Event | None:
    """The first of ``events`` to be set (checked in order), or ``None`` on timeout."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return next((event for event in events if event.is_set()), None)


# -- shared -------------------------------------------------------------------------------------


def _json(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{option} is not valid JSON ({error}): {text}") from None


def _json_object(text: str, option: str) -> dict[str, Any]:
    value = _json(text, option)
    if not isinstance(value, dict):
        raise UsageError(f"{option} must be a JSON object, like {EXAMPLE_CRITERIA}: {text}")
    return value
