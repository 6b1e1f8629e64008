"""An SSE client for the tests: one ``EventSource``-like stream read over aiohttp (docs/sse.md)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from . import WAIT


class Stream:
    """One SSE response read event by event (comment lines skipped)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self, timeout: float = WAIT) -> dict[str, str]:
        """The next event's fields (``id``, ``event``, ``data``); {} at the end of the stream."""
        return await asyncio.wait_for(self._next(), timeout)

    async def _next(self) -> dict[str, str]:
        fields: dict[str, str] = {}
        while True:
            line = await self.response.content.readline()
            if not line:
                return fields
            text = line.decode().rstrip("\n")
            if text == "":
                if fields:
                    return fields
                continue
            if text.startswith(":"):
                continue
            key, _, value = text.partition(":")
            fields[key] = value.removeprefix(" ")

    async def ended(self, timeout: float = WAIT) -> bool:
        return await self.next(timeout) == {}


def data(body: Any) -> str:
    """The payload's JSON as the stream carries it (this inbound's payload is the whole body)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)
