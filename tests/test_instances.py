"""Several instances as one gateway (contract section 4): real ``bow-gateway serve`` processes
sharing a private redis-server, and ``serve --workers``."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import socketio

from .support import AUTH, Listener, token
from .support.instances import Gateway, children, gateway_env, health
from .support.redis_server import RedisServer

INBOUND = "/v1/messages"  # the embedded default's pass-through inbound
VERSION = "v1"  # ... its JWT outbound, whose criteria are the token's "criteria" claim
MARKER = "marker"


def worker_lines(log: str, pattern: str) -> list[str]:
    """The worker number of each log line whose message matches ``pattern``.

    ``serve`` logs JSON lines with a ``worker`` field (readable ``worker=N ...`` lines on a
    terminal); both are understood.
    """
    numbers = []
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            if "worker" in record and re.search(pattern, str(record.get("message", ""))):
                numbers.append(str(record["worker"]))
        elif (found := re.search(r"worker[ =](\d+)\b", line)) and re.search(pattern, line):
            numbers.append(found.group(1))
    return numbers


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture(scope="module")
def gateways(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Gateway]]:
    """Three instances of one gateway, each a process of its own on its own port."""
    env = gateway_env(redis_server.url, f"instances-{uuid.uuid4().hex[:8]}")
    folder = tmp_path_factory.mktemp("instances")
    started: list[Gateway] = []
    try:
        for number in range(3):
            started.append(Gateway(env, folder / f"instance-{number}.log"))
        for gateway in started:
            gateway.wait_healthy()
        yield started
    finally:
        for gateway in started:
            try:
                gateway.stop()
            except subprocess.TimeoutExpired:
                pass


Connect = Callable[..., Awaitable[Listener]]


@pytest.fixture
async def listen() -> AsyncIterator[Connect]:
    """``await listen(url, "USER/1", {"room": "a"})``: an authenticated listener on ``url``."""
    made: list[Listener] = []

    async def make(url: str, listener_id: str, criteria: dict[str, Any]) -> Listener:
        listener = Listener(url)
        made.append(listener)
        await listener.connect(VERSION)
        assert await listener.authenticate(token(listener_id, criteria)) is None
        return listener

    yield make
    await asyncio.gather(*(listener.close() for listener in made))


Post = Callable[..., Awaitable[aiohttp.ClientResponse]]


@pytest.fixture
def post(http: aiohttp.ClientSession) -> Post:
    """``await post(url, name, audience, **fields)``: POST to the pass-through inbound."""

    async def send(url: str, name: str, audience: list[Any], **fields: Any) -> Any:
        body = {"name": name, "audience": audience, **fields}
        async with http.post(url + INBOUND, json=body, headers=AUTH) as response:
            await response.read()
            return response

    return send


async def accepted(post: Post, url: str, name: str, audience: list[Any], **fields: Any) -> None:
    response = await post(url, name, audience, **fields)
    assert response.status == 204, f"POST to {url}: {response.status}"


async def until_marker(listener: Listener, timeout: float = 5) -> list[tuple[str, Any]]:
    """Every event the listener receives before the marker (so no sleep proves an absence)."""
    events = []
    async with asyncio.timeout(timeout):
        while (event := await listener.events.get())[0] != MARKER:
            events.append(event)
    return events


async def eventually_healthy(
    http: aiohttp.ClientSession, gateways: list[Gateway], status: int, timeout: float
) -> float:
    """Wait until every instance's ``/health`` answers ``status``; the seconds it took."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            while [await health(http, g.url) for g in gateways] != [status] * len(gateways):
                await asyncio.sleep(0.05)
    except TimeoutError:
        statuses = [await health(http, g.url) for g in gateways]
        raise AssertionError(f"/health answered {statuses}, not all {status}") from None
    return time.monotonic() - started


async def probe_until_received(
    post: Post, gateways: list[Gateway], audience: list[Any], listeners: list[Listener]
) -> float:
    """POST probe messages to ``audience`` (through each instance in turn) until every listener
    has received one; the seconds that took. Criteria travel asynchronously. Each call's probes
    have a name of their own (``probe-...``): one call's late probes do not answer the next."""
    started = time.monotonic()
    probe = unique("probe")

    async def watch(listener: Listener) -> None:
        while (await listener.events.get())[0] != probe:
            pass

    watchers = [asyncio.create_task(watch(listener)) for listener in listeners]
    try:
        async with asyncio.timeout(5):
            probes = 0
            while not all(watcher.done() for watcher in watchers):
                await accepted(post, gateways[probes % len(gateways)].url, probe, audience)
                probes += 1
                await asyncio.wait(watchers, timeout=0.02)
        await asyncio.gather(*watchers)
    finally:
        for watcher in watchers:
            watcher.cancel()
    return time.monotonic() - started


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- one gateway over three processes -----------------------------------------------------------


async def test_a_message_posted_to_any_instance_reaches_every_instance(
    gateways: list[Gateway], listen: Connect, post: Post
) -> None:
    room, elsewhere = unique("room"), unique("elsewhere")
    matching = [
        await listen(gateway.url, f"FAN/{number}", {"room": room})
        for number, gateway in enumerate(gateways)
    ]
    # One id with a socket on every instance: each socket gets each message once.
    matching += [
        await listen(gateway.url, "FAN/everywhere", {"room": room}) for gateway in gateways
    ]
    others = [
        await listen(gateway.url, f"OTHER/{number}", {"room": elsewhere})
        for number, gateway in enumerate(gateways)
    ]

    sent: list[dict[str, Any]] = []
    for _ in range(3):
        for number, gateway in enumerate(gateways):
            n = len(sent)
            await accepted(post, gateway.url, "news", [{"room": room}], n=n, via=number)
            sent.append({"name": "news", "audience": [{"room": room}], "n": n, "via": number})
    everyone = [{"room": room}, {"room": elsewhere}]
    await accepted(post, gateways[2].url, MARKER, everyone)

    received = await asyncio.gather(*(until_marker(listener) for listener in matching))
    for number, events in enumerate(received):
        assert events == [("news", body) for body in sent], f"matching listener {number}"
    for number, listener in enumerate(others):
        assert await until_marker(listener) == [], f"non-matching listener {number}"


async def test_new_criteria_reach_the_sockets_of_that_id_on_every_instance(
    gateways: list[Gateway], listen: Connect, post: Post
) -> None:
    old, new = unique("old"), unique("new")
    both = [{"team": old}, {"team": new}]
    first, second = [await listen(g.url, "USER/moving", {"team": old}) for g in gateways[:2]]
    await accepted(post, gateways[2].url, "for-old", [{"team": old}])
    await accepted(post, gateways[2].url, MARKER, both)
    for listener in (first, second):
        assert [name for name, _ in await until_marker(listener)] == ["for-old"]

    # The same id authenticates on the third instance with new criteria.
    third = await listen(gateways[2].url, "USER/moving", {"team": new})
    took = await probe_until_received(post, gateways, [{"team": new}], [first, second])
    assert took < 1.0, f"the new criteria took {took:.2f} s to reach the old sockets"

    # From now on the old audience reaches none of the three sockets, the new one all of them.
    for number, gateway in enumerate(gateways):
        await accepted(post, gateway.url, "for-old", [{"team": old}], via=number)
        await accepted(post, gateway.url, "for-new", [{"team": new}], via=number)
    await accepted(post, gateways[0].url, MARKER, both)
    for listener in (first, second, third):
        names = [name for name, _ in await until_marker(listener) if not name.startswith("probe")]
        assert names == ["for-new"] * 3


async def test_a_change_of_type_alone_is_a_change_on_every_instance(
    gateways: list[Gateway], listen: Connect, post: Post
) -> None:
    team = unique("team")

    def level(value: Any) -> list[dict[str, Any]]:
        return [{"team": team, "level": value}]

    sockets = [await listen(gateways[0].url, "USER/strict", {"team": team, "level": 1})]
    # 1, "1" and true are three different criteria (Bow's loose comparison missed the change).
    for gateway, value in ((gateways[1], "1"), (gateways[2], True)):
        sockets.append(await listen(gateway.url, "USER/strict", {"team": team, "level": value}))
        took = await probe_until_received(post, gateways, level(value), sockets)
        assert took < 1.0, f"level {value!r} took {took:.2f} s to reach every socket"
    for stale in (1, "1", 1.0):
        await accepted(post, gateways[0].url, "stale", level(stale))
    await accepted(post, gateways[0].url, MARKER, level(True))
    for listener in sockets:
        assert [
            name for name, _ in await until_marker(listener) if not name.startswith("probe")
        ] == []


async def test_disconnect_posted_on_one_instance_disconnects_on_every_instance(
    gateways: list[Gateway], listen: Connect, post: Post
) -> None:
    group, others = unique("group"), unique("others")
    doomed = [
        await listen(gateway.url, f"DOOMED/{number}", {"group": group})
        for number, gateway in enumerate(gateways)
    ]
    doomed += [await listen(gateway.url, "DOOMED/all", {"group": group}) for gateway in gateways]
    spared = [
        await listen(gateway.url, f"SPARED/{number}", {"group": others})
        for number, gateway in enumerate(gateways)
    ]
    await accepted(post, gateways[1].url, "__disconnect", [{"group": group}])
    async with asyncio.timeout(5):
        await asyncio.gather(*(listener.disconnected.wait() for listener in doomed))
    for listener in doomed:
        assert listener.events.empty(), "__disconnect is not delivered as an event"
    await accepted(post, gateways[2].url, MARKER, [{"group": group}, {"group": others}])
    for listener in spared:
        assert await until_marker(listener) == []
        assert listener.client.connected


# -- serve --workers ---------------------------------------------------------------------------


async def test_workers_share_one_port_as_one_gateway(
    redis_server: RedisServer, tmp_path: Path, listen: Connect, post: Post
) -> None:
    env = gateway_env(redis_server.url, unique("workers"))
    gateway = Gateway(env, tmp_path / "workers.log", "--workers", "2")
    try:
        await asyncio.to_thread(gateway.wait_healthy)
        # Both workers listen (the first to bind answers /health alone).
        async with asyncio.timeout(15):
            while set(worker_lines(gateway.output(), "serving on")) != {"0", "1"}:
                assert gateway.process.poll() is None, gateway.tail()
                await asyncio.sleep(0.05)
        workers = [
            pid for pid in children(gateway.process.pid) if "--multiprocessing-fork" in cmdline(pid)
        ]
        assert len(workers) == 2, f"worker processes: {workers}"

        # Long-polling needs sticky sessions, which workers sharing one port cannot give.
        polling = socketio.AsyncClient(reconnection=False)
        with pytest.raises(socketio.exceptions.ConnectionError):
            await polling.connect(
                f"{gateway.url}?v={VERSION}", transports=["polling"], wait_timeout=5
            )
        assert not polling.connected

        room = unique("room")
        listeners = await asyncio.gather(
            *(listen(gateway.url, f"USER/{n}", {"room": room}) for n in range(16))
        )
        # Which worker took a connection: only their logs tell.
        connected = worker_lines(gateway.output(), r"socket \S+ connected")
        assert set(connected) == {"0", "1"}, f"connections per worker: {connected}"

        for n in range(20):  # each POST also lands on either worker
            await accepted(post, gateway.url, "news", [{"room": room}], n=n)
        await accepted(post, gateway.url, MARKER, [{"room": room}])
        for events in await asyncio.gather(*(until_marker(each) for each in listeners)):
            assert [body["n"] for _, body in events] == list(range(20))

        started = time.monotonic()
        status = await asyncio.to_thread(gateway.stop, 10)
        took = time.monotonic() - started
        assert status == 0, gateway.tail()
        assert took < 5, f"the workers took {took:.1f} s to stop"
        assert not any(alive(pid) for pid in workers)
        async with asyncio.timeout(5):
            await asyncio.gather(*(each.disconnected.wait() for each in listeners))
    finally:
        if gateway.process.returncode is None:
            gateway.kill()


async def test_workers_need_redis(tmp_path: Path) -> None:
    gateway = Gateway(gateway_env(None, "workers"), tmp_path / "workers.log", "--workers", "2")
    try:
        status = await asyncio.to_thread(gateway.process.wait, 20)
    finally:
        if gateway.process.returncode is None:
            gateway.kill()
        else:
            gateway.stop()
    assert status == 2
    assert "--workers needs redis" in gateway.output()


# -- Redis down, Redis back (last: it stops the module's Redis) ----------------------------------


async def test_health_follows_redis_on_every_instance(
    redis_server: RedisServer,
    gateways: list[Gateway],
    http: aiohttp.ClientSession,
    listen: Connect,
    post: Post,
) -> None:
    room = unique("room")
    listeners = [
        await listen(gateway.url, f"USER/{number}", {"room": room})
        for number, gateway in enumerate(gateways)
    ]
    await eventually_healthy(http, gateways, 200, timeout=5)
    try:
        await asyncio.to_thread(redis_server.stop)
        await eventually_healthy(http, gateways, 503, timeout=5)
        response = await post(gateways[0].url, "lost", [{"room": room}])
        assert response.status == 503
        assert int(response.headers["Retry-After"]) >= 1
    finally:
        await asyncio.to_thread(redis_server.start)
    await eventually_healthy(http, gateways, 200, timeout=10)

    # Delivery resumes on every instance, and nothing refused was delivered.
    for number, gateway in enumerate(gateways):
        await accepted(post, gateway.url, "back", [{"room": room}], via=number)
    await accepted(post, gateways[0].url, MARKER, [{"room": room}])
    for listener in listeners:
        assert [body["via"] for _, body in await until_marker(listener)] == [0, 1, 2]
