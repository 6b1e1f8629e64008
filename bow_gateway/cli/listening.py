"""What ``bow-gateway listen``'s three protocols share: the plan (where and how to connect, with
which token and filters) and the way they print, so that a line means the same whatever carried it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

PROTOCOLS: Final = ("socketio", "flywheel", "sse")
DEFAULT_PATHS: Final = {"flywheel": "/broker", "sse": "/events"}
"""The embedded default's ``outbound.flywheel_path`` and ``outbound.sse_path``."""


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
        return f"{self.url}?v={self.version}" + (f"&proto={self.proto}" if self.proto else "")


def say(text: str) -> None:
    """One line on stderr, at once: what listen says about the session, not an event."""
    print(text, file=sys.stderr, flush=True)


def print_line(line: dict[str, Any]) -> None:
    """One event as a JSON line on stdout, at once (a pipe reads it as it comes)."""
    print(json.dumps(line, ensure_ascii=False), flush=True)


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
