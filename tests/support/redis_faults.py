"""A publisher of numbered messages and a wait for the last of them, for the tests that break
Redis under a gateway."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from . import AUTH, PATH, Listener

END = "end"


@dataclass
class Post:
    """One POST: what it carried, when it was under way, and the answer."""

    n: int
    started: float
    ended: float = 0.0
    status: int = 0
    retry_after: str | None = None


@dataclass
class Publisher:
    """POSTs ``{"name": "tick", "src": name, "n": 0, 1, 2, ...}`` to one instance, one at a time
    (each waits for the previous answer, so the order of acceptance is the order of ``n``), at
    least ``interval`` s between two starts, until ``stop`` is set or ``limit`` POSTs were made."""

    name: str
    url: str
    audience: list[dict[str, Any]]
    posts: list[Post] = field(default_factory=list)
    interval: float = 0.0
    limit: int | None = None

    def accepted(self) -> int:
        return sum(post.status == 204 for post in self.posts)

    async def run(self, http: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set() and (self.limit is None or len(self.posts) < self.limit):
            post = Post(len(self.posts), time.monotonic())
            self.posts.append(post)
            body = {"name": "tick", "audience": self.audience, "src": self.name, "n": post.n}
            async with http.post(self.url + PATH, json=body, headers=AUTH) as response:
                await response.read()
                post.status = response.status
                post.retry_after = response.headers.get("Retry-After")
            post.ended = time.monotonic()
            await asyncio.sleep(max(0.005, post.started + self.interval - post.ended))


async def until_ends(listener: Listener, count: int, timeout: float = 10) -> list[tuple[str, Any]]:
    """Every event the listener receives until ``count`` end markers (which are not returned);
    if they do not come (in time, or before the listener is disconnected), what came instead, so
    that the assertions below tell what went wrong."""
    events: list[tuple[str, Any]] = []
    ends = 0
    try:
        async with asyncio.timeout(timeout):
            while ends < count:
                if listener.events.empty():
                    if listener.disconnected.is_set():
                        events.append(("disconnected", None))
                        break
                    await asyncio.sleep(0.01)
                    continue
                event = listener.events.get_nowait()
                if event[0] == END:
                    ends += 1
                else:
                    events.append(event)
    except TimeoutError:
        events.append(("no end marker", None))
    return events
