"""The attacks through the inbound (POSTs) and SSE streams: ``queries``, ``recovery``,
``sse-slow``, ``auth-brute``; and the history ``replay`` reads, written before its window."""

from __future__ import annotations

import asyncio
import collections
import json
import time
from typing import Any

import aiohttp

from lib import gateway
from lib.attacks import HISTORY_TOPIC, INBOUND, MB, NOBODY, VERSION
from lib.attacks.wire import basic_auth, post_all, sockets_connected


async def attack_queries(spec: dict[str, Any]) -> dict[str, Any]:
    body = b'{"name":"x","audience":[' + b",".join([b"{}"] * spec["queries"]) + b"]}"
    headers = {
        "Content-Type": "application/json",
        "Authorization": aiohttp.encode_basic_auth(gateway.USER, gateway.PASSWORD),
    }
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        async with http.post(spec["url"] + INBOUND, data=body, headers=headers) as r:
            answer = await r.read()
            status = r.status
    return {
        "body bytes": len(body),
        "status": status,
        "answer bytes": len(answer),
        "seconds": round(time.monotonic() - started, 2),
    }


async def first_sse_event(response: aiohttp.ClientResponse, limit: float) -> str:
    """The first event of an SSE stream (``__gap too_old``...), or why there is none."""
    try:
        block = await asyncio.wait_for(response.content.readuntil(b"\n\n"), limit)
    except TimeoutError:
        return f"no event within {limit:g} s"
    except (aiohttp.ClientError, ValueError, OSError) as error:
        return f"ended ({type(error).__name__})"
    fields = dict(
        line.split(": ", 1) for line in block.decode(errors="replace").splitlines() if ": " in line
    )
    event = fields.get("event", "(id only)")
    try:
        data = json.loads(fields.get("data", "null"))
    except ValueError:
        data = None
    reason = data.get("reason") if isinstance(data, dict) else None
    return f"{event} {reason}" if reason else event


async def attack_recovery(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    url = spec["url"]
    filler = "x" * spec["message_bytes"]
    body = json.dumps({"name": "bulk", "audience": [{"__id": NOBODY}], "blob": filler}).encode()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        marker = {"name": "bulk", "audience": [{"__id": NOBODY}], "marker": True}
        async with http.post(url + INBOUND, json=marker, headers=basic_auth()) as r:
            await r.read()
            since = r.headers.get("Bow-Position", "")
        statuses = await post_all(
            http, url + INBOUND, [body] * spec["messages"], spec["concurrency"]
        )
        posted = time.monotonic() - started
        opened = time.monotonic()

        async def stream() -> tuple[str, float, str]:
            headers = {"Last-Event-ID": since, "Accept": "text/event-stream"}
            try:
                async with http.get(f"{url}/events?v={VERSION}", headers=headers) as response:
                    answered = time.monotonic() - opened
                    if response.status != 200:
                        return str(response.status), answered, "refused"
                    return "200", answered, await first_sse_event(response, spec["wait"])
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                return type(error).__name__, time.monotonic() - opened, "failed"

        streams = await asyncio.gather(*(stream() for _ in range(spec["streams"])))
    return {
        "Last-Event-ID": since,
        "POSTs": dict(statuses),
        "MB posted": round(len(body) * spec["messages"] / MB),
        "seconds posting": round(posted, 2),
        "streams": dict(collections.Counter(status for status, _, _ in streams)),
        "first events": dict(collections.Counter(first for _, _, first in streams)),
        "slowest stream's answer (s)": round(max(t for _, t, _ in streams), 2),
        "seconds": round(time.monotonic() - started, 2),
    }


async def write_history(http: aiohttp.ClientSession, spec: dict[str, Any]) -> dict[str, Any]:
    """The topic history ``replay`` reads, written by the backend before its window: batches of
    1,000 messages of ``HISTORY_TOPIC`` to the admins."""
    started = time.monotonic()
    entry = {"name": HISTORY_TOPIC, "audience": [{"role": "admin"}], "text": "x" * spec["bytes"]}
    batches = [
        json.dumps([entry] * min(1000, spec["entries"] - first)).encode()
        for first in range(0, spec["entries"], 1000)
    ]
    statuses = await post_all(http, spec["url"] + INBOUND, batches, 1)
    return {
        f"{HISTORY_TOPIC}: POSTs of 1,000": dict(statuses),
        "seconds": round(time.monotonic() - started, 2),
    }


async def attack_sse_slow(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    url = spec["url"]
    audience = [{"__id": spec["listener"]}]
    body = json.dumps({"name": "big", "audience": audience, "blob": "x" * spec["bytes"]}).encode()
    responses: list[aiohttp.ClientResponse] = []
    refused: collections.Counter[str] = collections.Counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        headers = {"Authorization": "Bearer " + spec["token"], "Accept": "text/event-stream"}

        async def open_stream() -> None:
            try:
                response = await http.get(f"{url}/events?v={VERSION}", headers=headers)
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                refused[type(error).__name__] += 1
                return
            if response.status == 200:
                responses.append(response)  # never read
            else:
                refused[str(response.status)] += 1
                response.close()

        await asyncio.gather(*(open_stream() for _ in range(spec["streams"])))
        metrics_open = await sockets_connected(http, url)
        statuses = await post_all(
            http, url + INBOUND, [body] * spec["messages"], spec["concurrency"]
        )
        await asyncio.sleep(spec["hold"])
        metrics_after = await sockets_connected(http, url)
        for response in responses:
            response.close()
    return {
        "streams open": len(responses),
        "streams refused": dict(refused),
        "POSTs": dict(statuses),
        "MB sent to each stream": round(len(body) * spec["messages"] / MB, 1),
        "bow_sockets_connected once open": metrics_open,
        "bow_sockets_connected after the messages": metrics_after,
        "seconds": round(time.monotonic() - started, 2),
    }


async def attack_auth_brute(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    body = json.dumps({"name": "x", "audience": [{"__id": NOBODY}]}).encode()
    guesses = iter(range(spec["posts"]))
    # From another loopback address than the honest backend's (127.0.0.1): the gateway blocks
    # an address, the right credentials included.
    connector = aiohttp.TCPConnector(limit=0, local_addr=(spec["address"], 0))
    async with aiohttp.ClientSession(connector=connector) as http:
        statuses: collections.Counter[str] = collections.Counter()

        async def guesser() -> None:
            for guess in guesses:
                headers = basic_auth(f"wrong-{guess}")
                try:
                    async with http.post(spec["url"] + INBOUND, data=body, headers=headers) as r:
                        await r.read()
                        statuses[str(r.status)] += 1
                except (TimeoutError, aiohttp.ClientError, OSError) as error:
                    statuses[type(error).__name__] += 1

        await asyncio.gather(*(guesser() for _ in range(spec["concurrency"])))
    return {
        "from": spec["address"],
        "statuses": dict(statuses),
        "seconds": round(time.monotonic() - started, 2),
    }
