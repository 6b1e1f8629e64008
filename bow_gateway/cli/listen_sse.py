"""``bow-gateway listen --protocol sse``: read the Server-Sent Events stream (docs/sse.md) as
``curl -N`` would, and print each event as listen prints any, with its ``id`` as the position.

Like a browser's ``EventSource`` it resumes by itself when the stream ends without an alert (a
cut connection, a proxy's timeout, a restarted gateway) or with an alert whose advice is to
reconnect now (4012: the gateway stops), sending the last id as ``Last-Event-ID``, for up to
:data:`PATIENCE` seconds. Any other ``alert`` is the gateway telling it to stop: it ends there
(exit 1), but for ``token_expired`` with a token it minted (``--id``): then it reopens at once
with a fresh one, and misses nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from . import listening
from .common import stop_on_signals
from .listening import Plan, coded, print_line, read_until_stopped, reconnects_now, say

TOKEN_EXPIRED: Final = "token_expired"


@dataclass
class Ended:
    """How one stream ended: ``alert`` (its data), ``refused`` (the status and JSON body before
    the stream), ``lost`` (no alert: the connection went, ``opened`` if it was a stream, or never
    came; ``why``)."""

    kind: str
    info: dict[str, Any]
    status: int = 0
    why: str = ""
    retry_after: float = 0.0
    opened: bool = False


def address_of(plan: Plan) -> str:
    """``http://host:port/events?v=v1&topic=...``: the stream's URL, without the token."""
    query = [("v", plan.version), *(("topic", topic) for topic in plan.topics)]
    return f"{plan.url}{plan.path}?{urllib.parse.urlencode(query)}"


async def run(plan: Plan) -> int:
    """Listen until Ctrl-C/SIGTERM (0), or the gateway's alert, a refusal, or no stream for
    :data:`PATIENCE` seconds (1); then say the last position to resume after."""
    stop = stop_on_signals()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        listener = SseListener(http, plan)
        status = await read_until_stopped(stop, listener.run())
    if listener.last_id:
        say(
            f"bow-gateway listen: last position {listener.last_id} "
            f"(resume with --since {listener.last_id})"
        )
    return 0 if status is None else status


class SseListener:
    """Streams, one after the other, each resuming after the last id the previous one gave."""

    def __init__(self, http: aiohttp.ClientSession, plan: Plan) -> None:
        self.http = http
        self.plan = plan
        self.address = address_of(plan)
        self.token = plan.token
        self.last_id = plan.since or ""
        self.opened = False  # a stream was opened once: later ones resume

    async def run(self) -> int:
        delay = listening.FIRST_DELAY
        lost_since: float | None = None
        while True:
            ended = await self.stream()
            if ended.kind == "alert" and not reconnects_now(ended.info):
                if ended.info.get("reason") != TOKEN_EXPIRED or self.plan.fresh is None:
                    say("bow-gateway listen: the gateway ended the stream")
                    return 1
                say("bow-gateway listen: reopening with a fresh token")
                self.token = self.plan.fresh()
                lost_since, delay = None, listening.FIRST_DELAY
                continue
            if ended.kind == "refused" and ended.status != 503:
                text = ended.info.get("text") or ended.why
                say(
                    f"bow-gateway listen: {self.address} refused the stream: {ended.status}: "
                    f"{text} ({coded(ended.info)})"
                )
                return 1
            if ended.kind == "lost" and not self.opened:
                say(f"bow-gateway listen: cannot reach {self.address}: {ended.why}")
                return 1
            if ended.opened:
                # it had a stream: patience starts again
                lost_since, delay = None, listening.FIRST_DELAY
            now = time.monotonic()
            lost_since = now if lost_since is None else lost_since
            if now - lost_since > listening.PATIENCE:
                say(f"bow-gateway listen: no stream for {listening.PATIENCE:g} s: giving up")
                return 1
            wait = max(delay, ended.retry_after)
            if ended.kind == "alert":
                said = f"the gateway advises reconnecting now ({coded(ended.info)})"
            elif ended.opened:
                said = "the stream ended without an alert" + (
                    f" ({ended.why})" if ended.why else ""
                )
            else:
                text = ended.info.get("text") or ended.why
                said = (
                    ended.why
                    if ended.kind == "lost"
                    else f"refused for now: {ended.status}: {text}"
                )
            after = f" after {self.last_id}" if self.last_id else ""
            say(f"bow-gateway listen: {said}; resuming{after} in {wait:g} s")
            await asyncio.sleep(wait)
            delay = min(delay * 2, listening.MAX_DELAY)
            if self.plan.fresh is not None:
                self.token = self.plan.fresh()

    async def stream(self) -> Ended:
        """One stream, from the request to its end."""
        headers = {"Accept": "text/event-stream"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.last_id:
            headers["Last-Event-ID"] = self.last_id
        opened = False
        try:
            async with self.http.get(self.address, headers=headers) as response:
                if response.status != 200:
                    return await _refusal(response)
                if self.opened:
                    say(f"bow-gateway listen: resumed on {self.address}")
                else:
                    say(
                        f"listening on {self.address}; "
                        "events appear below as JSON lines (Ctrl-C to stop)"
                    )
                self.opened = opened = True
                alert = await self.events(response.content)
        except (aiohttp.ClientError, OSError) as error:
            return Ended("lost", {}, why=str(error) or type(error).__name__, opened=opened)
        if alert is not None:
            return Ended("alert", alert, opened=True)
        return Ended("lost", {}, opened=True)

    async def events(self, content: aiohttp.StreamReader) -> dict[str, Any] | None:
        """Print the stream's events until it ends; its alert's data, if it sent one."""
        alert: dict[str, Any] | None = None
        name, data = "", []
        while line := await content.readline():
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            if text:
                field, _, value = text.partition(":")
                value = value.removeprefix(" ")
                if field == "event":
                    name = value
                elif field == "data":
                    data.append(value)
                elif field == "id" and "\x00" not in value:
                    self.last_id = value  # an id alone moves the last id on, without an event
                continue
            if data:  # a blank line dispatches the event (one without data is none)
                alert = self.dispatch(name or "message", "\n".join(data)) or alert
            name, data = "", []
        return alert

    def dispatch(self, name: str, data: str) -> dict[str, Any] | None:
        """Print one event; its data when it is the gateway's alert."""
        try:
            value: Any = json.loads(data)
        except ValueError:
            value = data
        if name == "alert":
            info = value if isinstance(value, dict) else {"text": value}
            say(f"alert: {info.get('text')} ({coded(info)})")
            return info
        print_line({"event": name, "data": value, "position": self.last_id or None})
        return None


async def _refusal(response: aiohttp.ClientResponse) -> Ended:
    """An answer other than the stream: its JSON ``{"code", "reason", "text"}``, if it has one."""
    try:
        body = await response.json(content_type=None)
    except ValueError:
        body = None
    info = body if isinstance(body, dict) else {}
    try:
        retry_after = float(response.headers.get("Retry-After", "0"))
    except ValueError:
        retry_after = 0.0
    return Ended("refused", info, response.status, response.reason or "", retry_after)
