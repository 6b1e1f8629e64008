"""``reach_bench.py``'s fallback part: a base where ``audience`` listeners hold ``{"cohort": 1}``
(the others ``{"cohort": 2}``), every tenth of them connected as a protocol-2 Socket.IO socket that
acknowledges, one message to ``[{"cohort": 1}]`` with ``Bow-Fallback: S``, and the
``message.undelivered`` events a local receiver gets: when the last came, and whether they list
exactly the listeners that were not connected."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import redis

from lib import gateway as bench_gateway
from lib.audience_index import write_index
from lib.lean.books import Books, monotonic_ns
from lib.lean.connect import factory
from lib.lean.websocket import LeanClient
from lib.listeners import mint
from lib.reach_gateways import Gateway, Receiver

NAMESPACE = "fallback"
AUDIENCE = [{"cohort": 1}]
AUTH = {"Authorization": aiohttp.BasicAuth(bench_gateway.USER, bench_gateway.PASSWORD).encode()}


@dataclass
class Outcome:
    """What the fallback part measured and found."""

    connected: int = 0
    connect_seconds: float = 0.0
    connect_cpu_ms: float = float("nan")  # gateway CPU per socket connected (ms)
    stall_ms: float = float("nan")  # the gateway's longest event-loop stall, publish to S s
    events_stall_ms: float = float("nan")  # the same, from S s after publish to the events
    undelivered_cpu_s: float = float("nan")  # gateway CPU from the receipt's end to the end
    delivered_ms: float = float("nan")  # publish to the last socket's copy
    first_event_s: float = float("nan")  # publish to the first message.undelivered's arrival
    last_event_s: float = float("nan")  # publish to the last message.undelivered's arrival
    events: int = 0
    listed: int = 0
    problems: list[str] | None = None
    reach: dict[str, Any] | None = None


def base(listeners: int, audience: int) -> tuple[list[str], list[dict[str, Any]]]:
    """``bench-0``..: the first ``audience`` in cohort 1, the others in cohort 2."""
    ids = [f"bench-{i}" for i in range(listeners)]
    criteria = [{"cohort": 1 if i < audience else 2, "all": True} for i in range(listeners)]
    return ids, criteria


async def connect(
    books: Books, port: int, tokens: list[str], concurrency: int = 200, retries: int = 30
) -> tuple[list[LeanClient], list[str]]:
    """Protocol-2 lean sockets authenticated with ``tokens``, retried after a 503."""
    loop = asyncio.get_running_loop()
    room = asyncio.Semaphore(concurrency)
    clients: list[LeanClient] = []
    failures: list[str] = []

    async def one(token: str) -> None:
        for attempt in range(retries + 1):
            client = LeanClient(books, f"127.0.0.1:{port}", token, proto=2)
            async with room:
                try:
                    await loop.create_connection(factory(client), "127.0.0.1", port)
                    await asyncio.wait_for(client.ready, 60)
                except (OSError, TimeoutError) as error:
                    client.close()
                    if "503" not in client.reason or attempt == retries:
                        failures.append(f"{type(error).__name__}: {error} {client.reason}")
                        return
                else:
                    clients.append(client)
                    return
            await asyncio.sleep(1.0 + random.random())

    await asyncio.gather(*(one(token) for token in tokens))
    return clients, failures


async def publish(http: aiohttp.ClientSession, url: str, seconds: int) -> str:
    body = {"name": "bench", "audience": AUDIENCE, "seq": 0, "t": monotonic_ns()}
    headers = {**AUTH, "Bow-Fallback": str(seconds)}
    async with http.post(url + bench_gateway.PATH, json=body, headers=headers) as answer:
        if answer.status != 204:
            raise SystemExit(f"publish: {answer.status} {await answer.text()}")
        return answer.headers.get("Bow-Message-Id", "")


def listed_of(receiver: Receiver) -> tuple[list[Any], list[float], int]:
    """Every listener the ``message.undelivered`` events listed, their arrivals, and how many
    events said ``left_out``."""
    listed: list[Any] = []
    arrivals: list[float] = []
    left_out = 0
    for at, body in receiver.received:
        if body["type"] == "message.undelivered":
            listed += body["data"]["listeners"]
            arrivals.append(at)
            left_out += "left_out" in body["data"]
    return listed, arrivals, left_out


async def wait_events(receiver: Receiver, expected: int, timeout: float) -> None:
    """Until the events list ``expected`` listeners (or ``timeout``), then 2 s more."""
    deadline = time.monotonic() + timeout
    while len(listed_of(receiver)[0]) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(2.0)


def check(
    receiver: Receiver, ids: list[str], connected: set[str], audience: int, left_out: int
) -> list[str]:
    listed, _, _ = listed_of(receiver)
    want = set(ids[:audience]) - connected
    got = set(map(str, listed))
    problems = []
    if got != want:
        problems.append(
            f"listed {len(got):,} distinct listeners, want {len(want):,}: {len(want - got):,} "
            f"missing, {len(got - want):,} extra ({len(got & connected):,} of them connected)"
        )
    if len(listed) != len(got):
        problems.append(f"{len(listed) - len(got):,} listed twice")
    if left_out:
        problems.append(f"{left_out} events said left_out")
    if receiver.unverified:
        problems.append(f"{receiver.unverified} requests failed verification")
    return problems


async def run(
    redis_url: str, listeners: int, audience: int, seconds: int, cpu: int, profile: str | None
) -> Outcome:
    """The whole fallback part on the private Redis ``redis_url``."""
    ids, criteria = base(listeners, audience)
    started = time.monotonic()
    write_index(redis.Redis.from_url(redis_url), NAMESPACE, "f1", ids, criteria)
    print(f"  index of {listeners:,} listeners written in {time.monotonic() - started:.1f} s")
    receiver = Receiver()
    await receiver.start()
    gateway = Gateway(redis_url, NAMESPACE, cpu, webhook=receiver.url, profile=profile)
    books, outcome = Books(), Outcome()
    try:
        chosen = range(0, audience, 10)
        tokens = [mint(ids[i], bench_gateway.SECRET, criteria[i]) for i in chosen]
        started, cpu0 = time.monotonic(), await gateway.cpu()
        clients, failures = await connect(books, gateway.port, tokens)
        outcome.connect_seconds = time.monotonic() - started
        outcome.connected = len(clients)
        outcome.connect_cpu_ms = 1000 * (await gateway.cpu() - cpu0) / max(1, len(clients))
        print(
            f"  {len(clients):,} sockets in {outcome.connect_seconds:.1f} s, "
            f"{len(failures)} failed {failures[:3]}"
        )
        connected = {ids[i] for i in chosen}
        async with aiohttp.ClientSession() as http:
            async with http.post(
                gateway.url + "/_bow/reach", json={"audience": AUDIENCE}, headers=AUTH
            ) as answer:
                outcome.reach = await answer.json()
            await outcome_of(gateway, http, books, receiver, outcome, seconds, audience)
        outcome.problems = check(receiver, ids, connected, audience, listed_of(receiver)[2])
        if failures:
            outcome.problems.append(f"{len(failures)} sockets failed to connect: {failures[:3]}")
        books.closing = True
        for client in clients:
            client.close()
    finally:
        gateway.stop()
        await receiver.stop()
    return outcome


async def outcome_of(
    gateway: Gateway,
    http: aiohttp.ClientSession,
    books: Books,
    receiver: Receiver,
    outcome: Outcome,
    seconds: int,
    audience: int,
) -> None:
    """Publish, wait for every socket's copy then for the events; the timings in ``outcome``."""
    done: list[int] = []
    books.expect(0, monotonic_ns(), outcome.connected, lambda: done.append(monotonic_ns()))
    await gateway.command("stall")  # resets the longest stall
    gateway.start_profile()
    t0, t0_ns = time.time(), monotonic_ns()
    await publish(http, gateway.url, seconds)
    try:
        await asyncio.wait_for(books.idle.wait(), 30)
    except TimeoutError:
        pass
    outcome.delivered_ms = (done[0] - t0_ns) / 1e6 if done else float("nan")
    await asyncio.sleep(max(0.0, t0 + seconds - time.time()))  # the receipt's end
    cpu = await gateway.cpu()
    outcome.stall_ms = 1000 * float((await gateway.command("stall"))["stall"]["longest"])
    await wait_events(receiver, audience - outcome.connected, seconds + 60)
    outcome.undelivered_cpu_s = await gateway.cpu() - cpu  # with 2 s idle settling
    outcome.events_stall_ms = 1000 * float((await gateway.command("stall"))["stall"]["longest"])
    await gateway.stop_profile("fallback")
    listed, arrivals, _ = listed_of(receiver)
    outcome.events = len(arrivals)
    outcome.listed = len(listed)
    if arrivals:
        outcome.first_event_s, outcome.last_event_s = min(arrivals) - t0, max(arrivals) - t0
