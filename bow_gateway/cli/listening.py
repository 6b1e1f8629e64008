"""What ``bow-gateway listen``'s three protocols share: the plan (where and how to connect, with
which token and filters) and the way they print, so that a line means the same whatever carried it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.parse
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

from ..core import codes
from .common import StdoutClosed

PROTOCOLS: Final = ("socketio", "flywheel", "sse")
DEFAULT_PATHS: Final = {"flywheel": "/broker", "sse": "/events"}
"""The embedded default's ``outbound.flywheel_path`` and ``outbound.sse_path``."""
CODES: Final = {code.code: code for code in vars(codes).values() if isinstance(code, codes.Code)}
"""Each code of section 10 (its reason word, its advice), by number."""
PATIENCE: Final = 30.0  # seconds of failed tries to reconnect before giving up
FIRST_DELAY: Final = 1.0  # seconds before the first try, doubled after each failed one
MAX_DELAY: Final = 10.0


@dataclass
class Plan:
    """What to connect with: ``proto`` is the Socket.IO handshake's (``None``: not sent), ``token``
    the first token (``None``: anonymous), ``fresh`` mints a new one (``None``: the token was
    given), ``topics`` the topic filters, ``path`` the Flywheel or SSE endpoint's."""

    url: str
    version: str
    token: str | None
    proto: str | None = None
    since: str | None = None
    fresh: Callable[[], str] | None = None
    protocol: str = "socketio"
    topics: tuple[str, ...] = ()
    path: str = ""

    @property
    def address(self) -> str:
        """``http://host:port/?v=v1&proto=2``: the Socket.IO handshake's URL, as printed."""
        query = {"v": self.version, **({"proto": self.proto} if self.proto else {})}
        return f"{self.url}/?{urllib.parse.urlencode(query)}"


def say(text: str) -> None:
    """One line on stderr, at once: what listen says about the session, not an event."""
    print(text, file=sys.stderr, flush=True)


def print_line(line: dict[str, Any]) -> None:
    """One event as a JSON line on stdout, at once (a pipe reads it as it comes);
    :class:`StdoutClosed` once nobody reads it any more."""
    try:
        print(json.dumps(line, ensure_ascii=False), flush=True)
    except BrokenPipeError:
        raise StdoutClosed from None


def reconnects_now(info: dict[str, Any]) -> bool:
    """The code's advice is to reconnect at once (4012: the instance stops, and another one, or
    the same restarted, answers): from the alert's ``reconnect``, else from the code's own."""
    code = CODES.get(info.get("code", 0))
    return (info.get("reconnect") or (code.reconnect if code else None)) == "now"


def coded(info: dict[str, Any]) -> str:
    """``code 4100 refresh_required``, from an alert's info or a refusal's data."""
    return " ".join(str(part) for part in ("code", info.get("code"), info.get("reason")) if part)


async def first_of(*events: asyncio.Event, timeout: float | None = None) -> asyncio.Event | None:
    """The first of ``events`` to be set (checked in order), or ``None`` on timeout."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return next((event for event in events if event.is_set()), None)


async def read_until_stopped(stop: asyncio.Event, read: Coroutine[Any, Any, int]) -> int | None:
    """Run ``read`` until it ends (its exit status) or ``stop`` is set (Ctrl-C, SIGTERM: None,
    once ``read`` is cancelled and has ended, as a client closes)."""
    reading = asyncio.ensure_future(read)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not reading.done():
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        return None
    return reading.result()


class RecentIds:
    """The last ``size`` message ids seen, to drop a message seen twice: a recovery may replay
    what arrived just before the connection was lost."""

    def __init__(self, size: int = 10_000) -> None:
        self._order: deque[str] = deque()
        self._ids: set[str] = set()
        self._size = size

    def first(self, message_id: str) -> bool:
        """Whether ``message_id`` is seen for the first time (it is remembered from now on)."""
        if message_id in self._ids:
            return False
        self._ids.add(message_id)
        self._order.append(message_id)
        if len(self._order) > self._size:
            self._ids.discard(self._order.popleft())
        return True
