"""Opening many lean clients of one protocol at once, each authenticated as its listener."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from lib import listeners
from lib.lean.books import Books
from lib.lean.flywheel import FlywheelClient
from lib.lean.sse import SseClient
from lib.lean.websocket import LeanClient

PROTOCOLS = ("socketio", "flywheel", "sse")  # what --protocol takes


def factory(client: LeanClient) -> Callable[[], LeanClient]:
    """``create_connection``'s protocol factory for ``client``."""
    return lambda: client


def make_client(protocol: str, books: Books, host: str, token: str, proto: int) -> LeanClient:
    """A lean client of ``protocol`` (``socketio`` speaks Socket.IO protocol ``proto``)."""
    if protocol == "flywheel":
        return FlywheelClient(books, host, token)
    if protocol == "sse":
        return SseClient(books, host, token)
    return LeanClient(books, host, token, proto)


async def open_clients(
    books: Books,
    host: str,
    port: int,
    n: int,
    concurrency: int,
    proto: int = 1,
    retries: int = 30,
    protocol: str = "socketio",
) -> tuple[list[LeanClient], list[str]]:
    """Connect and authenticate listeners 0..n-1, ``concurrency`` handshakes at a time."""
    loop = asyncio.get_running_loop()
    semaphore = asyncio.Semaphore(concurrency)
    clients: list[LeanClient] = []
    failures: list[str] = []
    refused = [0]  # handshakes answered 503 (the gateway's connection-rate limit), then retried
    tokens = [listeners.token(i) for i in range(n)]

    async def open_one(i: int) -> None:
        for attempt in range(retries + 1):
            client = make_client(protocol, books, f"{host}:{port}", tokens[i], proto)
            async with semaphore:
                try:
                    await loop.create_connection(factory(client), host, port)
                    await asyncio.wait_for(client.ready, 60)
                except (OSError, TimeoutError) as error:  # ConnectionError is an OSError
                    client.close()
                    if b"503 Service Unavailable" in client.reason.encode() and attempt < retries:
                        refused[0] += 1  # over outbound.max_connects_per_second: as advised
                    else:
                        failures.append(f"{type(error).__name__}: {error}")
                        return
                else:
                    clients.append(client)
                    return
            await asyncio.sleep(1.0 + random.random())  # Retry-After: 1, jittered

    await asyncio.gather(*(open_one(i) for i in range(n)))
    if refused[0]:
        print(
            f"  {refused[0]:,} handshakes were refused 503 (over the gateway's "
            "outbound.max_connects_per_second) and retried after 1-2 s, as Retry-After says",
            flush=True,
        )
    return clients, failures
