"""``restart_bench.py``'s clients: one protocol-2 client per listener, the messages they are
sent (a mix: everyone, the 10% group, one listener), and their reconnection all at once."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lib import listeners
from lib.lean.books import EVENT
from lib.lean.posters import Posters
from lib.lean.recovering import RecoveringClient

Spec = tuple[str, int]  # ("all", 0), ("g10", 0) or ("id", listener)


def plan(count: int, sockets: int, rng: random.Random) -> list[Spec]:
    """``count`` audiences: one in 5 to everyone, one in 5 to the 10% group, the rest to one."""
    specs: list[Spec] = []
    for k in range(count):
        if k % 5 == 0:
            specs.append(("all", 0))
        elif k % 5 == 1:
            specs.append(("g10", 0))
        else:
            specs.append(("id", rng.randrange(sockets)))
    return specs


def audience(spec: Spec) -> bytes:
    kind, listener = spec
    if kind == "all":
        return b'[{"all":true}]'
    if kind == "g10":
        return b'[{"g10":true}]'
    return b'[{"__id":"%s"}]' % listeners.listener_id(listener).encode()


def targets(i: int, spec: Spec) -> bool:
    kind, listener = spec
    if kind == "all":
        return True
    if kind == "g10":
        return bool(listeners.criteria(i)["g10"])
    return listener == i


async def post_all(posters: Posters, specs: list[Spec], tag: str) -> int:
    """POST the messages one at a time, in order; how many were not answered 204."""
    failed = 0
    for k, spec in enumerate(specs):
        body = b'{"name":"%s","audience":%s,"payload":{"tag":"%s","k":%d}}' % (
            EVENT.encode(),
            audience(spec),
            tag.encode(),
            k,
        )
        if await posters.post(body) != 204:
            failed += 1
    return failed


class Fleet:
    """The clients, one per listener, and their tokens."""

    def __init__(self, host: str, port: int, sockets: int) -> None:
        self.host, self.port = host, port
        self.tokens = [listeners.token(i) for i in range(sockets)]
        self.clients: list[RecoveringClient | None] = [None] * sockets

    async def open(
        self, i: int, options: dict[str, Any], expected: int, timeout: float
    ) -> RecoveringClient:
        client = RecoveringClient(f"{self.host}:{self.port}", self.tokens[i], options, expected)
        self.clients[i] = client
        loop = asyncio.get_running_loop()
        await loop.create_connection(lambda: client, self.host, self.port)
        await asyncio.wait_for(asyncio.shield(client.done), timeout)
        return client

    def close(self) -> None:
        for client in self.clients:
            if client is not None:
                client.books.closing = True
                client.close()


async def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@dataclass
class Reconnection:
    """Every client reconnecting at once with ``since``: each one's outcome."""

    sockets: int
    attempts: Counter[int] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    done_at: list[float | None] = field(default_factory=list)  # s from the start, recovered
    outcome: list[RecoveringClient | None] = field(default_factory=list)
    succeeded_at: list[int | None] = field(default_factory=list)  # which attempt connected
    took: float = 0.0  # s, the whole reconnection

    def __post_init__(self) -> None:
        self.done_at = [None] * self.sockets
        self.outcome = [None] * self.sockets
        self.succeeded_at = [None] * self.sockets


async def reconnect_all(
    args: argparse.Namespace,
    fleet: Fleet,
    positions: list[str | None],
    expected: list[int],
    rng: random.Random,
) -> Reconnection:
    """Every client at once, each retrying after ``--retry-after`` (jittered) if it could not
    connect, at most ``--retries`` times."""
    done = Reconnection(args.sockets)
    started = time.perf_counter()

    async def again(i: int) -> None:
        for attempt in range(args.retries + 1):
            done.attempts[attempt] += 1
            try:
                client = await fleet.open(i, {"since": positions[i]}, expected[i], args.timeout)
            except (OSError, TimeoutError) as error:
                failed_client = fleet.clients[i]
                reason = failed_client.reason if failed_client is not None else ""
                done.failures[(reason or f"{type(error).__name__}: {error}")[:120]] += 1
                if failed_client is not None:
                    failed_client.close()
                await asyncio.sleep(args.retry_after * (1 + rng.random()))
                continue
            done.done_at[i] = client.done.result() - started
            done.outcome[i] = client
            done.succeeded_at[i] = attempt
            return

    await asyncio.gather(*(again(i) for i in range(args.sockets)))
    done.took = time.perf_counter() - started
    return done


def recovered(done: Reconnection, expected: list[int]) -> tuple[Counter[str], int, int]:
    """The acks' results and reasons; how many recovered everything, at the first attempt."""
    reasons = Counter[str]()
    count = first_try = 0
    for i, client in enumerate(done.outcome):
        if client is None:
            reasons["could not connect"] += 1
            continue
        result: dict[str, Any] = client.result if isinstance(client.result, dict) else {}
        replays = [p for p, replayed in client.events if replayed]
        ok = (
            result.get("recovered") is True
            and client.replayed == expected[i]
            and all(replayed for _, replayed in client.events[: expected[i]])
            and len(set(replays)) == len(replays)
        )
        if result.get("recovered") is True and not ok:
            reasons["recovered: true, wrong replay"] += 1
        else:
            reasons[f"recovered: {result.get('recovered')}, reason {result.get('reason')}"] += 1
        if ok:
            count += 1
            first_try += done.succeeded_at[i] == 0
    return reasons, count, first_try
