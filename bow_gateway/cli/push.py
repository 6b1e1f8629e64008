"""``bow-gateway push``: POST messages to an inbound, three ways.

- A message as JSON, ``{"name", "audience", ...payload's keys}`` (``--name``, ``--audience``).
- Gobbler's REST publish (``--topic chat/room1``): a raw text body to ``{path}/{topic}``, a path
  with a parameter (``/api/message/{topic:.+}``), with ``X-Gobbler-*`` headers (``--header``)
  and the publisher's ``userId`` and ``messageId`` in the query.
- A JSON-lines file (``--batch FILE``), one message body per line, sent as JSON lists of at most
  ``--batch-size`` messages and ``--batch-bytes`` bytes, one request each, in order.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Final
from urllib.parse import quote

from ..app.standalone_defaults import DEFAULT_INBOUND_PATH, DEFAULT_USERNAME, DEV_INBOUND_PASSWORD
from .clients import json_value
from .common import (
    EXAMPLE_AUDIENCE,
    EXAMPLE_PAYLOAD,
    PASSWORD_ENV,
    UsageError,
    counted,
    positive_int,
)

if TYPE_CHECKING:  # imported where used: the command line's parser imports this module
    import aiohttp

TOPIC_PATH: Final = "/api/message"
"""Where ``--topic`` posts without ``--path``: Gobbler's REST API."""
HEADER_PREFIX: Final = "X-Gobbler-"
BATCH_SIZE: Final = 1_000  # inbound.max_batch's default
BATCH_BYTES: Final = 1_048_576  # inbound.max_body_size's default
TIMEOUT: Final = 10.0  # seconds for each request


def add_arguments(push: argparse.ArgumentParser) -> None:
    """``push``'s options (beside ``--url``)."""
    push.add_argument(
        "--path",
        help=f"the inbound's path (default: {DEFAULT_INBOUND_PATH}; with --topic, {TOPIC_PATH})",
    )
    push.add_argument(
        "--user", default=DEFAULT_USERNAME, help=f"Basic Auth user (default: {DEFAULT_USERNAME})"
    )
    push.add_argument(
        "--password",
        help=f"Basic Auth password (default: ${PASSWORD_ENV}, else {DEV_INBOUND_PASSWORD})",
    )
    push.add_argument("--name", help="the event name listeners receive")
    push.add_argument(
        "--audience", metavar="JSON", help=f"a JSON list of queries, like '{EXAMPLE_AUDIENCE}'"
    )
    push.add_argument("--payload", metavar="JSON", help=f"a JSON object, like '{EXAMPLE_PAYLOAD}'")
    push.add_argument(
        "--envelope",
        action="store_true",
        help='send {"name", "audience", "payload"} instead (for an envelope inbound)',
    )
    push.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="send Idempotency-Key: KEY (1 to 200 of A-Z a-z 0-9 . _ : -): a retry with the same "
        "KEY and message is answered the first 204 and delivers nothing again",
    )
    gobbler = push.add_argument_group("Gobbler's REST publish")
    gobbler.add_argument(
        "--topic", help="POST --body as text to PATH/TOPIC (the message is /TOPIC)"
    )
    gobbler.add_argument("--body", default="", metavar="TEXT", help="the raw body (default: empty)")
    gobbler.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"sent as {HEADER_PREFIX}KEY: VALUE, a header of the message (repeatable)",
    )
    gobbler.add_argument("--user-id", help="the publisher's user id (the query's userId)")
    gobbler.add_argument("--message-id", help="the publisher's message id (the query's messageId)")
    batches = push.add_argument_group("batches")
    batches.add_argument(
        "--batch",
        metavar="FILE",
        help="a JSON-lines file, one message body per line, sent as JSON lists (batches)",
    )
    batches.add_argument(
        "--batch-size",
        type=positive_int,
        default=BATCH_SIZE,
        metavar="N",
        help=f"messages per request, at most the inbound.max_batch (default: {BATCH_SIZE:,})",
    )
    batches.add_argument(
        "--batch-bytes",
        type=positive_int,
        default=BATCH_BYTES,
        metavar="BYTES",
        help=f"bytes per request, at most the inbound.max_body_size (default: {BATCH_BYTES:,}); "
        "a longer line is sent alone",
    )


@dataclass(frozen=True)
class Request:
    """One POST of the command: where, what, and how it is described in its lines."""

    url: str
    data: bytes
    headers: dict[str, str]
    params: dict[str, str]


MODE_OPTIONS: Final = {
    "json": ("name", "audience", "payload", "envelope", "idempotency_key"),
    "topic": ("body", "header", "user_id", "message_id", "idempotency_key"),
    "batch": (),
}
"""The options of each way to push (``--batch`` takes ``--batch-size`` and ``--batch-bytes``,
whose defaults are always set)."""


def push(args: argparse.Namespace) -> int:
    """Check the options' combination, then send as they say; 0 once all is accepted."""
    if args.topic is not None and args.batch is not None:
        raise UsageError("give --topic or --batch, not both")
    mode = "topic" if args.topic is not None else "batch" if args.batch is not None else "json"
    allowed = MODE_OPTIONS[mode]
    for options in MODE_OPTIONS.values():
        for option in options:
            if option not in allowed and getattr(args, option) not in (None, False, [], ""):
                flag = "--" + option.replace("_", "-")
                goes = "goes with --topic" if mode == "json" else f"does not go with --{mode}"
                raise UsageError(f"{flag} {goes}")
    import aiohttp

    password = args.password or os.environ.get(PASSWORD_ENV) or DEV_INBOUND_PASSWORD
    auth = {"Authorization": aiohttp.encode_basic_auth(args.user, password)}
    base = args.url.rstrip("/")
    if mode == "topic":
        return asyncio.run(_post_one(_topic_request(args, base, auth)))
    url = base + (args.path or DEFAULT_INBOUND_PATH)
    if mode == "batch":
        try:
            file = open(args.batch, "rb")  # closed below, once its batches are sent
        except OSError as error:
            raise UsageError(f"cannot read --batch {args.batch}: {error.strerror}") from None
        with file:
            return asyncio.run(_post_batches(url, auth, file, args.batch_size, args.batch_bytes))
    if args.name is None or args.audience is None:
        raise UsageError("give --name and --audience (or --topic TOPIC, or --batch FILE)")
    headers = {**auth, "Content-Type": "application/json", **_keyed(args)}
    return asyncio.run(_post_one(Request(url, json.dumps(_message(args)).encode(), headers, {})))


def _keyed(args: argparse.Namespace) -> dict[str, str]:
    return {} if args.idempotency_key is None else {"Idempotency-Key": args.idempotency_key}


def _message(args: argparse.Namespace) -> dict[str, Any]:
    audience = json_value(args.audience, "--audience")
    body: dict[str, Any] = {"name": args.name, "audience": audience}
    if args.payload is None:
        return body
    payload = json_value(args.payload, "--payload")
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
    return body


def _topic_request(args: argparse.Namespace, base: str, auth: dict[str, str]) -> Request:
    topic = args.topic.lstrip("/")
    if not topic:
        raise UsageError("--topic must not be empty")
    headers = {**auth, "Content-Type": "text/plain; charset=utf-8", **_keyed(args)}
    for option in args.header:
        key, equals, value = option.partition("=")
        if not equals or not key or any(c in key for c in " \t:") or "\n" in option:
            raise UsageError(f"--header must look like KEY=VALUE, KEY without spaces: {option!r}")
        headers[HEADER_PREFIX + key] = value
    params = {"userId": args.user_id, "messageId": args.message_id}
    path = (args.path or TOPIC_PATH).rstrip("/")
    return Request(
        f"{base}{path}/{quote(topic, safe='/')}",
        args.body.encode(),
        headers,
        {key: value for key, value in params.items() if value is not None},
    )


MAX_HEADER = 65_536  # a batch's Bow-Message-Ids: ~17 bytes a message


async def _post_one(request: Request) -> int:
    import aiohttp

    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=TIMEOUT), max_field_size=MAX_HEADER
    ) as session:
        answer = await _post(session, request)
    if answer is None:
        return 1
    status, text = answer
    if not status.startswith("204 "):
        print(f"bow-gateway push: {status}" + (f": {text}" if text else ""), file=sys.stderr)
        return 1
    print(f"{status}: accepted")
    return 0


async def _post(session: aiohttp.ClientSession, request: Request) -> tuple[str, str] | None:
    """``("204 No Content", text)``, or ``None`` (said on stderr) when the gateway is out of
    reach."""
    import aiohttp

    try:
        async with session.post(
            request.url, data=request.data, headers=request.headers, params=request.params
        ) as response:
            text = (await response.text()).strip()
    except (aiohttp.ClientError, TimeoutError) as error:
        print(
            f"bow-gateway push: cannot reach {request.url}: {error or type(error).__name__}",
            file=sys.stderr,
        )
        return None
    return f"{response.status} {response.reason}", text


async def _post_batches(
    url: str, auth: dict[str, str], file: IO[bytes], size: int, max_bytes: int
) -> int:
    """Each batch of ``file`` in turn; stops at the first refusal, saying what was accepted."""
    import aiohttp

    headers = {**auth, "Content-Type": "application/json"}
    accepted = requests = 0
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=TIMEOUT), max_field_size=MAX_HEADER
    ) as session:
        try:
            for first, last, lines in _batches(file, size, max_bytes):
                data = b"[" + b",".join(lines) + b"]"
                answer = await _post(session, Request(url, data, headers, {}))
                if answer is None:
                    return 1
                status, text = answer
                if not status.startswith("204 "):
                    said = f": {text}" if text else ""
                    print(
                        f"bow-gateway push: {status}{said} (lines {first}-{last}; "
                        f"{_before(accepted, 'them')})",
                        file=sys.stderr,
                    )
                    return 1
                accepted += len(lines)
                requests += 1
                print(f"{status}: accepted lines {first}-{last} ({counted(len(lines), 'message')})")
        except BatchFileError as error:
            print(f"bow-gateway push: {error} ({_before(accepted, 'it')})", file=sys.stderr)
            return 1
    print(f"accepted {counted(accepted, 'message')} in {counted(requests, 'request')}")
    return 0


def _before(accepted: int, what: str) -> str:
    """``the 2 messages before it were accepted``, ``the 1 message before it was accepted``."""
    were = "was" if accepted == 1 else "were"
    return f"the {counted(accepted, 'message')} before {what} {were} accepted"


class BatchFileError(ValueError):
    """A line of a ``--batch`` file that is not JSON."""


def _batches(file: IO[bytes], size: int, max_bytes: int) -> Iterator[tuple[int, int, list[bytes]]]:
    """``(first line, last line, lines)`` of at most ``size`` lines and ``max_bytes`` bytes as a
    JSON list (one line alone may be more); blank lines are skipped, each other one must be
    JSON (:class:`BatchFileError` otherwise)."""
    lines: list[bytes] = []
    first = last = 0
    total = 1  # "[", then each line and the "," or "]" after it
    for number, raw in enumerate(file, start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            json.loads(line)
        except ValueError as error:
            raise BatchFileError(f"line {number} of the batch file is not JSON: {error}") from None
        if lines and (len(lines) == size or total + len(line) + 1 > max_bytes):
            yield first, last, lines
            lines, total = [], 1
        if not lines:
            first = number
        lines.append(line)
        total += len(line) + 1
        last = number
    if lines:
        yield first, last, lines
