"""The posters of ``history_bench.py``: batches of messages POSTed back to back or paced."""

from __future__ import annotations

import asyncio
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from lib import gateway
from lib.histories.messages import NOBODY, batch_body, envelope, monotonic_ns
from lib.histories.subscriber import Subscriber


@dataclass
class Posting:
    """What the posters did: messages accepted (``204``), refusals by status."""

    accepted: int = 0
    posts: int = 0
    refused: dict[int, int] = field(default_factory=dict)
    post_ns: array[int] = field(default_factory=lambda: array("q"))  # round trips of the window
    record: bool = False


async def post_loop(
    session: aiohttp.ClientSession,
    url: str,
    body: Any,
    count: int,
    posting: Posting,
    stop: asyncio.Event,
    pace: list[float] | None = None,
    total: int | None = None,
) -> None:
    """POST ``body()`` (``count`` messages) until ``stop`` (or ``total`` messages in all);
    ``pace``: [the next batch's due time (monotonic s), seconds per batch], shared."""
    while not stop.is_set():
        if total is not None:
            if posting.posts * count >= total:
                return
            posting.posts += 1  # reserve this batch
        if pace is not None:
            due = pace[0]
            pace[0] = max(due, time.monotonic() - pace[1]) + pace[1]  # no catching up in bursts
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        started = monotonic_ns()
        async with session.post(url, data=body()) as response:
            await response.read()
            status = response.status
        if total is None:
            posting.posts += 1
        if status == 204:
            posting.accepted += count
            if posting.record:
                posting.post_ns.append(monotonic_ns() - started)
        else:
            posting.refused[status] = posting.refused.get(status, 0) + 1
            if status >= 500:
                await asyncio.sleep(0.05)


def session_for(posters: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=posters, force_close=False)
    authorization = aiohttp.encode_basic_auth(gateway.USER, gateway.PASSWORD)
    headers = {"Authorization": authorization, "Content-Type": "application/json"}
    return aiohttp.ClientSession(connector=connector, headers=headers)


async def fill(
    url: str, name: str, total: int, batch: int, posters: int, audience: list[dict[str, Any]]
) -> tuple[Posting, float]:
    """POST ``total`` messages to ``name`` in batches, ``posters`` at a time; the time it took."""
    posting, stop = Posting(), asyncio.Event()
    started = time.monotonic()
    async with session_for(posters) as session:
        await asyncio.gather(
            *(
                post_loop(
                    session,
                    url,
                    lambda: batch_body(name, batch, audience),
                    batch,
                    posting,
                    stop,
                    total=total,
                )
                for _ in range(posters)
            )
        )
    return posting, time.monotonic() - started


async def caught_up(url: str, probe: Subscriber, limit: float = 120.0) -> float:
    """POST one message to ``probe`` alone and wait for it: the gateway's consumer, which reads
    the event stream in order, has then read everything published before. The time it took."""
    started = time.monotonic()
    count = probe.count
    async with session_for(1) as session:
        body = b"[" + envelope(probe.topic, monotonic_ns(), [{"room": 3}]) + b"]"
        async with session.post(url, data=body) as response:
            await response.read()
    while probe.count == count and time.monotonic() - started < limit and not probe.lost:
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def fill_topics(url: str, topics: int, batch: int) -> Posting:
    """One message to each of ``topics`` topics ``chat/t/<k>``, ``batch`` per POST."""
    posting = Posting()
    async with session_for(4) as session:
        for first in range(0, topics, batch):
            items = [
                envelope(f"chat/t/{k}", monotonic_ns(), NOBODY)
                for k in range(first, min(topics, first + batch))
            ]
            async with session.post(url, data=b"[" + b",".join(items) + b"]") as response:
                await response.read()
                posting.posts += 1
                if response.status == 204:
                    posting.accepted += len(items)
                else:
                    posting.refused[response.status] = posting.refused.get(response.status, 0) + 1
    return posting
