"""What the attackers of ``attack_bench.py`` share: URLs, tokens, a websocket reader, POSTs."""

from __future__ import annotations

import asyncio
import collections
import random
import string
from collections.abc import Sequence
from typing import Any

import aiohttp

from lib import gateway
from lib.attacks import VERSION
from lib.listeners import mint


def gateway_token(listener_id: str, criteria: dict[str, Any]) -> str:
    return mint(listener_id, gateway.SECRET, criteria)


def ws_url(url: str, version: str | None = VERSION) -> str:
    query = "EIO=4&transport=websocket" + (f"&v={version}" if version else "")
    return url.replace("http://", "ws://", 1) + "/socket.io/?" + query


async def reader(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Read until the gateway closes the websocket, answering Engine.IO pings."""
    async for message in ws:
        if message.type == aiohttp.WSMsgType.TEXT and message.data == "2":
            await ws.send_str("3")


async def sockets_connected(http: aiohttp.ClientSession, url: str) -> float | None:
    try:
        async with http.get(url + "/metrics") as response:
            text = await response.text()
    except aiohttp.ClientError:
        return None
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("bow_sockets_connected")
    ]
    return sum(values) if values else None


def topic_filters(prefix: str, count: int, levels: int) -> list[str]:
    """``count`` distinct filters of ``levels`` levels each (3 random characters a level, the
    first one naming ``prefix`` and the filter): 100 of 32 levels are 13 KB of JSON, a frame
    under ``outbound.max_incoming_bytes``."""
    rng = random.Random(prefix)
    alphabet = string.ascii_lowercase + string.digits
    filters = []
    for i in range(count):
        levels_after = ("".join(rng.choices(alphabet, k=3)) for _ in range(levels - 1))
        filters.append("/".join([f"{prefix}-{i}", *levels_after]))
    return filters


def plain_ws_url(url: str, path: str, query: str = "") -> str:
    return url.replace("http://", "ws://", 1) + f"{path}?v={VERSION}" + query


def basic_auth(password: str = gateway.PASSWORD) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Authorization": aiohttp.encode_basic_auth(gateway.USER, password),
    }


async def post_all(
    http: aiohttp.ClientSession,
    url: str,
    bodies: Sequence[bytes],
    concurrency: int,
    headers: dict[str, str] | None = None,
) -> collections.Counter[str]:
    """POST every body, ``concurrency`` at a time; how many got each status."""
    statuses: collections.Counter[str] = collections.Counter()
    queue = iter(bodies)

    async def poster() -> None:
        for body in queue:
            try:
                async with http.post(url, data=body, headers=headers or basic_auth()) as r:
                    await r.read()
                    statuses[str(r.status)] += 1
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                statuses[type(error).__name__] += 1

    await asyncio.gather(*(poster() for _ in range(concurrency)))
    return statuses


async def sio_ack(ws: aiohttp.ClientWebSocketResponse, ack: int) -> str:
    """The arguments of the acknowledgement ``ack`` (Engine.IO pings answered meanwhile)."""
    prefix = f"43{ack}["
    while True:
        message = await ws.receive(timeout=10)
        if message.type is not aiohttp.WSMsgType.TEXT:
            raise ConnectionError(f"closed ({ws.close_code}) before the acknowledgement")
        if message.data == "2":
            await ws.send_str("3")
        elif message.data.startswith(prefix):
            return str(message.data[len(prefix) - 1 :])
