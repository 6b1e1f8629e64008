"""``bow-gateway history TOPIC``: print a topic's kept messages as a listener may see them.

It connects with Socket.IO protocol 2, authenticates with the given (or a minted) token, sends
``replay`` (docs/history.md) and prints one JSON line per message, ``{"event", "data",
"sequence"}``, then the count on stderr. What it prints is what that listener's criteria match
now: the same filter as any replay.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from ..app.standalone_defaults import DEFAULT_VERSION
from .clients import json_object, mint, signing_secret
from .common import UsageError, counted, positive_int
from .listening import Plan

WAIT = 30.0  # seconds for each answer (connect, authenticate, the whole replay)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic", help="the topic: a message name kept by a [[history]] filter")
    parser.add_argument(
        "--version",
        default=DEFAULT_VERSION,
        help=f"the outbound version (default: {DEFAULT_VERSION})",
    )
    parser.add_argument("--token", help="the listener's token")
    parser.add_argument("--id", help="instead of --token: mint a token for this listener id")
    parser.add_argument("--criteria", metavar="JSON", help="with --id: the token's criteria")
    parser.add_argument(
        "--secret", help="with --id: the HS256 secret (default: $BOW_JWT_SECRET, else the dev one)"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--last", type=positive_int, metavar="N", help="the last N messages (default: all kept)"
    )
    which.add_argument(
        "--from", dest="start", type=positive_int, metavar="SEQUENCE", help="from this sequence on"
    )
    parser.add_argument("--max-count", type=positive_int, metavar="N", help="at most N messages")


def history(args: argparse.Namespace) -> int:
    if args.token is not None and (args.id is not None or args.criteria is not None):
        raise UsageError("give --token, or --id (and --criteria), not both")
    if args.token is None and args.id is None:
        raise UsageError("give --token TOKEN, or --id ID [--criteria JSON] to mint one")
    token = args.token
    if token is None:
        criteria = json_object(args.criteria, "--criteria") if args.criteria else {}
        token = mint(args.id, signing_secret(args.secret), criteria)
    request: dict[str, Any] = {"topic": args.topic, "start": 0}
    if args.last is not None:
        request["start"] = -args.last
    elif args.start is not None:
        request["start"] = args.start
    if args.max_count is not None:
        request["max_count"] = args.max_count
    plan = Plan(args.url.rstrip("/"), args.version, token, proto="2")
    return asyncio.run(_replay(plan.address, token, request))


async def _replay(address: str, token: str, request: dict[str, Any]) -> int:
    import aiohttp  # here: the command line's parser imports this module
    import socketio

    async with aiohttp.ClientSession() as session:
        client = socketio.AsyncClient(reconnection=False, handle_sigint=False, http_session=session)

        async def on_event(event: str, *args: Any) -> None:
            payload, meta = [*args, None, None][:2]
            if isinstance(meta, dict) and meta.get("replayed"):
                line = {"event": event, "data": payload, "sequence": meta.get("sequence")}
                print(json.dumps(line, ensure_ascii=False), flush=True)

        client.on("*", on_event)
        try:
            await client.connect(address, transports=["websocket"], wait_timeout=10)
        except socketio.exceptions.ConnectionError as error:
            print(
                f"bow-gateway history: {address} refused the connection: {error}", file=sys.stderr
            )
            return 1
        try:
            result = await client.call("authenticate", (token, {}), timeout=WAIT)
            if not isinstance(result, dict) or "id" not in result:
                print(f"bow-gateway history: authentication refused: {result}", file=sys.stderr)
                return 1
            answer = await client.call("replay", request, timeout=WAIT)
        except socketio.exceptions.TimeoutError:
            print("bow-gateway history: no answer from the gateway", file=sys.stderr)
            return 1
        finally:
            if client.connected:
                await client.disconnect()
        if not isinstance(answer, dict) or "count" not in answer:
            refused = answer.get("error", answer) if isinstance(answer, dict) else answer
            text = refused.get("text", refused) if isinstance(refused, dict) else refused
            print(f"bow-gateway history: refused: {text}", file=sys.stderr)
            return 1
        print(f"{counted(answer['count'], 'message')} of {request['topic']}", file=sys.stderr)
        return 0
