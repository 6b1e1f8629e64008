"""Issue 11's attacks on Socket.IO and Engine.IO, and issue 27's ``filters``: raw websockets."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import time
from typing import Any

import aiohttp

from lib import proc
from lib.attacks import BINARY_HEADER, HOLDER_KINDS, MB, STILL_OPEN, VERSION
from lib.attacks.wire import reader, sio_ack, sockets_connected, topic_filters, ws_url


async def attack_frames(spec: dict[str, Any]) -> dict[str, Any]:
    counts: collections.Counter[str] = collections.Counter()
    total: int = spec["frames"]
    deadline = time.monotonic() + spec["seconds"]

    def more() -> bool:
        return counts["frames"] < total and time.monotonic() < deadline

    async def attacker(http: aiohttp.ClientSession) -> None:
        while more():
            try:
                ws = await http.ws_connect(ws_url(spec["url"]), autoping=True)
                await ws.receive(timeout=5)  # Engine.IO OPEN
            except (TimeoutError, aiohttp.ClientError, OSError):
                counts["connect failures"] += 1
                await asyncio.sleep(0.01)
                continue
            counts["connections"] += 1
            reading = asyncio.create_task(reader(ws))
            try:
                while more() and not reading.done() and not ws.closed:
                    await ws.send_str("789"[counts["frames"] % 3])
                    counts["frames"] += 1
                    if counts["frames"] % 20 == 0:
                        await asyncio.sleep(0)  # let the reader see a close
            except (aiohttp.ClientError, OSError):
                counts["send failures"] += 1
            if reading.done() or ws.closed:
                counts["closed by the gateway"] += 1
            reading.cancel()
            await ws.close()

    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(attacker(http) for _ in range(spec["connections"])))
    return {**counts, "seconds": round(time.monotonic() - started, 2)}


async def attack_binary(spec: dict[str, Any]) -> dict[str, Any]:
    counts: collections.Counter[str] = collections.Counter()
    frame = os.urandom(spec["frame_bytes"])
    cap_kib = proc.rss_kib(spec["pid"])["VmRSS"] + spec["rss_cap_mb"] * 1024
    deadline = time.monotonic() + spec["seconds"]
    capped = False

    def more() -> bool:
        nonlocal capped
        capped = capped or proc.rss_kib(spec["pid"])["VmRSS"] > cap_kib
        return not capped and time.monotonic() < deadline

    async def attacker(http: aiohttp.ClientSession) -> None:
        while more():
            try:
                ws = await http.ws_connect(ws_url(spec["url"]), autoping=True)
                await ws.receive(timeout=5)  # Engine.IO OPEN
                await ws.send_str("40")  # else the binary packet is refused as unexpected
                await ws.receive(timeout=5)  # 40{"sid": ...}
                if spec.get("token"):
                    await ws.send_str(f'421["authenticate",{json.dumps(spec["token"])}]')
                    while not (await ws.receive_str(timeout=5)).startswith("431"):
                        pass
                    counts["authenticated"] += 1
                await ws.send_str(BINARY_HEADER)
            except (TimeoutError, aiohttp.ClientError, OSError, TypeError) as error:
                counts[f"connect failures ({type(error).__name__})"] += 1
                await asyncio.sleep(0.05)
                continue
            counts["connections"] += 1
            reading = asyncio.create_task(reader(ws))
            try:
                while more() and not reading.done() and not ws.closed:
                    await ws.send_bytes(frame)
                    counts["frames"] += 1
                    await asyncio.sleep(0)
            except (aiohttp.ClientError, OSError):
                counts["send failures"] += 1
            if reading.done() or ws.closed:
                counts["closed by the gateway"] += 1
            reading.cancel()
            await ws.close()

    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(attacker(http) for _ in range(spec["connections"])))
    return {
        **counts,
        "MB sent": round(counts["frames"] * len(frame) / MB),
        "stopped at the RSS cap": capped,
        "seconds": round(time.monotonic() - started, 2),
    }


async def attack_holders(spec: dict[str, Any]) -> dict[str, Any]:
    opened: collections.Counter[str] = collections.Counter()
    failed: collections.Counter[str] = collections.Counter()
    closed: collections.Counter[str] = collections.Counter()
    lifetimes: list[float] = []
    semaphore = asyncio.Semaphore(spec["concurrency"])
    settled = asyncio.Event()
    pending = spec["holders"]

    async def hold(http: aiohttp.ClientSession, i: int) -> None:
        nonlocal pending
        kind = HOLDER_KINDS[i % len(HOLDER_KINDS)]
        try:
            async with semaphore:
                try:
                    version = None if kind == "refused-no-v" else VERSION
                    ws = await http.ws_connect(ws_url(spec["url"], version), autoping=True)
                    await ws.receive(timeout=10)  # Engine.IO OPEN
                    if kind != "engineio-only":
                        await ws.send_str("40")
                        await ws.receive(timeout=10)  # 40{"sid"...}, or 44{...} refused
                        if kind == "40-then-41":
                            await ws.send_str("41")
                except (TimeoutError, aiohttp.ClientError, OSError):
                    failed[kind] += 1
                    return
            opened[kind] += 1
        finally:
            pending -= 1
            if not pending:
                settled.set()
        since = time.monotonic()
        await reader(ws)  # until the gateway closes it, or the end of the hold
        closed[kind] += 1
        lifetimes.append(time.monotonic() - since)

    started = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        tasks = [asyncio.create_task(hold(http, i)) for i in range(spec["holders"])]
        await settled.wait()
        open_seconds = time.monotonic() - started
        metrics = await sockets_connected(http, spec["url"])
        await asyncio.sleep(spec["hold"])
        still_open = {kind: opened[kind] - closed[kind] for kind in HOLDER_KINDS}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "opened": dict(opened),
        "failed": dict(failed),
        "seconds to open all": round(open_seconds, 2),
        "bow_sockets_connected once open": metrics,
        "held (s)": spec["hold"],
        STILL_OPEN: still_open,
        "closed by the gateway": sum(closed.values()),
        "longest lifetime of a closed one (s)": round(max(lifetimes, default=0.0), 2),
        "seconds": round(time.monotonic() - started, 2),
    }


async def attack_filters(spec: dict[str, Any]) -> dict[str, Any]:
    counts: collections.Counter[str] = collections.Counter()
    semaphore = asyncio.Semaphore(spec["concurrency"])
    closed = 0
    url = ws_url(spec["url"]) + "&proto=2"

    async def socket(http: aiohttp.ClientSession, n: int, opened: asyncio.Event) -> None:
        nonlocal closed
        add = topic_filters(f"sio{n}", spec["filters"], spec["levels"])
        try:
            async with semaphore:
                try:
                    ws = await http.ws_connect(url, autoping=True)
                    await ws.receive(timeout=10)  # Engine.IO OPEN
                    await ws.send_str("40")
                    await ws.receive(timeout=10)  # 40{"sid": ...}
                    await ws.send_str('421["authenticate",null,{}]')  # anonymous
                    authenticated = await sio_ack(ws, 1)
                    counts["authenticated" if '"error"' not in authenticated else "refused"] += 1
                    await ws.send_str("422" + json.dumps(["subscribe", {"add": add}]))
                    answer = await sio_ack(ws, 2)
                    counts["subscribe refused" if '"error"' in answer else "subscribed"] += 1
                except (TimeoutError, ConnectionError, aiohttp.ClientError, OSError) as error:
                    counts[f"failed ({type(error).__name__})"] += 1
                    return
        finally:
            opened.set()
        await reader(ws)  # until the gateway closes it, or the end of the hold
        closed += 1

    started = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        events = [asyncio.Event() for _ in range(spec["sockets"])]
        tasks = [asyncio.create_task(socket(http, n, e)) for n, e in enumerate(events)]
        await asyncio.gather(*(e.wait() for e in events))
        open_seconds = time.monotonic() - started
        metrics = await sockets_connected(http, spec["url"])
        await asyncio.sleep(spec["hold"])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "subscribe bytes": len(json.dumps(topic_filters("sio0", spec["filters"], spec["levels"]))),
        **counts,
        "seconds to open all": round(open_seconds, 2),
        "bow_sockets_connected once open": metrics,
        "held (s)": spec["hold"],
        "closed by the gateway": closed,
        "seconds": round(time.monotonic() - started, 2),
    }
