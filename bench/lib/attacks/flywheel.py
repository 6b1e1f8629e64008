"""Issue 27's attacks over Flywheel (``/broker``) and Gobbler (``/gobbler``) connections."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import time
from typing import Any

import aiohttp

from lib.attacks import HISTORY_TOPIC
from lib.attacks.wire import plain_ws_url, topic_filters


async def flywheel_attack(
    spec: dict[str, Any], frames: Any, hello: str | None = None
) -> dict[str, Any]:
    """``spec["connections"]`` Flywheel connections, each sending ``hello`` (and waiting for its
    answer) then the frames ``frames(n)`` yields, in turn, as fast as the gateway reads them,
    for ``spec["seconds"]``; a connection the gateway closes is opened again."""
    counts: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + spec["seconds"]

    async def read(ws: aiohttp.ClientWebSocketResponse) -> None:
        async for message in ws:
            if message.type is aiohttp.WSMsgType.TEXT:
                kind = message.data[:1]
                counts[f"{kind} frames received"] += 1
                if kind == "B" and '"description"' in message.data:
                    counts["B answers with errors"] += 1
                elif message.data.startswith("R $remote/"):
                    counts["R $remote frames (errors, alerts)"] += 1

    async def attacker(http: aiohttp.ClientSession, n: int) -> None:
        sent = frames(n)
        while time.monotonic() < deadline:
            try:
                ws = await http.ws_connect(plain_ws_url(spec["url"], "/broker"), autoping=True)
                if hello is not None:
                    await ws.send_str(hello.replace("{n}", str(n)))
                    answer = await ws.receive(timeout=5)
                    if answer.type is not aiohttp.WSMsgType.TEXT:
                        raise ConnectionError(f"no bind answer: {answer.type.name}")
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                counts[f"connect failures ({type(error).__name__})"] += 1
                await asyncio.sleep(0.05)
                continue
            counts["connections"] += 1
            reading = asyncio.create_task(read(ws))
            try:
                while time.monotonic() < deadline and not reading.done() and not ws.closed:
                    await ws.send_str(next(sent))
                    counts["frames sent"] += 1
                    await asyncio.sleep(0)  # let the reader see an answer, or a close
            except (aiohttp.ClientError, OSError):
                counts["send failures"] += 1
            if reading.done() or ws.closed:
                await asyncio.gather(reading, return_exceptions=True)
                counts[f"closed by the gateway ({ws.close_code})"] += 1
            reading.cancel()
            await ws.close()

    started = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(attacker(http, n) for n in range(spec["connections"])))
    return {**counts, "seconds": round(time.monotonic() - started, 2)}


async def attack_flywheel_flood(spec: dict[str, Any]) -> dict[str, Any]:
    def frames(n: int) -> Any:
        mine = topic_filters(f"fly{n}", spec["filters"], spec["levels"])
        subscribe = "B " + json.dumps({"subscribe": mine})
        unsubscribe = "B " + json.dumps({"unsubscribe": mine})
        return itertools.cycle([subscribe, unsubscribe])

    return {
        "frame bytes": len(next(frames(0))),
        **await flywheel_attack(spec, frames),  # anonymous: no auth in any bind
    }


async def attack_flywheel_publish(spec: dict[str, Any]) -> dict[str, Any]:
    frame = "P bench/flood " + "x" * spec["body_bytes"]
    bind = {"sessionId": "publisher-{n}", "auth": {"type": "Bearer", "token": spec["token"]}}
    return await flywheel_attack(spec, lambda n: itertools.repeat(frame), "B " + json.dumps(bind))


async def attack_replay(spec: dict[str, Any]) -> dict[str, Any]:
    counts: collections.Counter[str] = collections.Counter()
    fetched: list[int] = []  # messages each connection received
    durations: list[float] = []  # from the command to #fetch-done
    started = time.monotonic()
    url = spec["url"]
    command = f"+ {HISTORY_TOPIC} 0 100000"

    async def replayer(http: aiohttp.ClientSession) -> None:
        query = "&token=" + spec["token"]
        received = 0
        try:
            ws = await http.ws_connect(plain_ws_url(url, "/gobbler", query), autoping=True)
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            counts[f"connect failures ({type(error).__name__})"] += 1
            return
        asked = time.monotonic()
        try:
            await ws.send_str(command)
            while True:
                left = deadline - time.monotonic()
                message = await ws.receive(timeout=max(left, 0.001))
                if message.type is not aiohttp.WSMsgType.TEXT:
                    counts[f"closed by the gateway ({ws.close_code})"] += 1
                    break
                text = message.data
                if text.startswith("#fetch-done"):
                    durations.append(time.monotonic() - asked)
                    counts["fetches done"] += 1
                    break
                if text.startswith("!"):
                    counts[text.split(" ", 1)[0]] += 1
                    break
                if not text.startswith("#"):
                    received += 1
        except TimeoutError:
            counts["still fetching at the deadline"] += 1
        except (aiohttp.ClientError, OSError) as error:
            counts[type(error).__name__] += 1
        fetched.append(received)
        await ws.close()

    deadline = time.monotonic() + spec["seconds"]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(replayer(http) for _ in range(spec["connections"])))
    return {
        "command": command,
        **counts,
        "messages received (all connections)": sum(fetched),
        "most by one connection": max(fetched, default=0),
        "slowest fetch (s)": round(max(durations, default=0.0), 2),
        "seconds": round(time.monotonic() - started, 2),
    }
