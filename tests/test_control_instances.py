"""Contract section 9 across instances: two ``bow-gateway serve`` processes sharing a private
redis-server, real python-socketio clients. Revokes, batches, kicks and counts posted on one
instance act on the sockets of both; a paused instance makes a count incomplete, never wrong;
Redis down is 503, too many counts 429; the embedded coroutines reach other processes' sockets.
(One instance, in-process: tests/test_control_sockets.py; HTTP validation: tests/test_control.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest
import socketio

from bow_gateway import Bow

from .support import AUTH, base_config, standard_bow, token
from .support.instances import Gateway, gateway_env
from .support.redis_server import RedisServer

INBOUND = "/v1/messages"  # serve's embedded default: pass-through inbound, JWT outbound "v1"
COUNT_TIMEOUT = 0.5
WAIT = 5.0  # seconds any one expected thing may take before the test fails


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Sock:
    """A python-socketio client that keeps every event with all its arguments, in order, and
    its disconnect (``("disconnect", ())``) in the same log."""

    def __init__(self, url: str, proto: int) -> None:
        self.url, self.proto = url, proto
        self.client = socketio.AsyncClient(reconnection=False)
        self.log: list[tuple[str, tuple[Any, ...]]] = []
        self.events: asyncio.Queue[tuple[str, tuple[Any, ...]]] = asyncio.Queue()
        self.disconnected = asyncio.Event()
        self.client.on("*", self._on_any)
        self.client.on("disconnect", self._on_disconnect)

    async def _on_any(self, event: str, *args: Any) -> None:
        self.log.append((event, args))
        self.events.put_nowait((event, args))

    async def _on_disconnect(self, *args: Any) -> None:
        self.log.append(("disconnect", ()))
        self.disconnected.set()

    async def start(self, listener_id: str, criteria: dict[str, Any]) -> Sock:
        version = "v1" if self.proto == 1 else "v1&proto=2"
        await self.client.connect(
            f"{self.url}?v={version}", transports=["websocket"], wait_timeout=WAIT
        )
        if self.proto == 1:
            assert await self.client.call("authenticate", token(listener_id, criteria)) is None
        else:
            result = await self.client.call(
                "authenticate", (token(listener_id, criteria), {}), timeout=WAIT
            )
            assert result["id"] == listener_id
        return self

    async def next_name(self) -> str:
        """The name of the next event (so no sleep proves an absence: a later message must be
        the next event, and delivery is in order)."""
        name, _ = await asyncio.wait_for(self.events.get(), WAIT)
        return name

    async def close(self) -> None:
        await self.client.disconnect()


Listen = Callable[..., Awaitable[Sock]]
Control = Callable[..., Awaitable[tuple[int, Any, dict[str, str]]]]
Post = Callable[..., Awaitable[None]]


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture(scope="module")
def namespace() -> str:
    return unique("control")


@pytest.fixture(scope="module")
def pair(
    redis_server: RedisServer, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Gateway, Gateway]]:
    """Instances A and B of one gateway, each a process of its own (so one can be paused)."""
    env = gateway_env(
        redis_server.url,
        namespace,
        BOW_API_COUNT_TIMEOUT=str(COUNT_TIMEOUT),
        BOW_API_MAX_COUNTS_PER_SECOND="2",
    )
    folder = tmp_path_factory.mktemp("control-instances")
    started: list[Gateway] = []
    try:
        for name in ("a", "b"):
            started.append(Gateway(env, folder / f"instance-{name}.log"))
        for gateway in started:
            gateway.wait_healthy()
        yield started[0], started[1]
    finally:
        for gateway in started:
            with contextlib.suppress(ProcessLookupError):  # should a test have left it paused
                os.kill(gateway.process.pid, signal.SIGCONT)
            try:
                gateway.stop()
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
async def listen() -> AsyncIterator[Listen]:
    """``await listen(url, "X", {"role": "admin"}, proto=2)``: an authenticated socket."""
    made: list[Sock] = []

    async def make(url: str, listener_id: str, criteria: dict[str, Any], proto: int = 1) -> Sock:
        sock = Sock(url, proto)
        made.append(sock)
        return await sock.start(listener_id, criteria)

    yield make
    await asyncio.gather(*(sock.close() for sock in made))


@pytest.fixture
def control(http: aiohttp.ClientSession) -> Control:
    """``await control(url, "count", body)``: status, JSON (200) or text, headers."""

    async def send(url: str, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        timeout = aiohttp.ClientTimeout(total=10)
        async with http.post(
            f"{url}/_bow/{path}", json=body, headers=AUTH, timeout=timeout
        ) as response:
            data = await response.json() if response.status == 200 else await response.text()
            return response.status, data, dict(response.headers)

    return send


@pytest.fixture
def post(http: aiohttp.ClientSession) -> Post:
    """``await post(url, name, audience)``: a message, which must be accepted."""

    async def send(url: str, name: str, audience: list[Any]) -> None:
        body = {"name": name, "audience": audience}
        async with http.post(url + INBOUND, json=body, headers=AUTH) as response:
            assert response.status == 204, f"{url}: {response.status} {await response.text()}"

    return send


async def health(http: aiohttp.ClientSession, url: str) -> int:
    try:
        async with http.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as response:
            return response.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


async def until_health(
    http: aiohttp.ClientSession, gateways: tuple[Gateway, ...], status: int, timeout: float = 10
) -> None:
    async with asyncio.timeout(timeout):
        while [await health(http, g.url) for g in gateways] != [status] * len(gateways):
            await asyncio.sleep(0.05)


# -- criteria -------------------------------------------------------------------------------------


async def test_a_revoke_on_one_instance_holds_for_a_message_posted_at_once_on_the_other(
    pair: tuple[Gateway, Gateway], listen: Listen, control: Control, post: Post
) -> None:
    a, b = pair
    x, y, role = unique("X"), unique("Y"), unique("role")
    revoked = [
        await listen(a.url, x, {"role": role}),
        await listen(b.url, x, {"role": role}),
        await listen(b.url, x, {"role": role}, proto=2),
    ]
    other = await listen(a.url, y, {"role": role})

    status, text, _ = await control(a.url, "criteria", {"id": x, "criteria": {}})
    assert (status, text) == (204, "")
    await post(b.url, "secret", [{"role": role}])  # right after the 204, on the other instance
    await post(b.url, "for-x", [{"__id": x}])

    assert await other.next_name() == "secret"
    for sock in revoked:
        assert await sock.next_name() == "for-x"  # the secret never came before it


async def test_a_batch_with_one_bad_entry_gets_422_naming_its_index_and_changes_nothing(
    pair: tuple[Gateway, Gateway], listen: Listen, control: Control, post: Post
) -> None:
    a, b = pair
    x, y, role = unique("X"), unique("Y"), unique("role")
    sockets = [await listen(gateway.url, x, {"role": role}) for gateway in pair]
    sockets.append(await listen(b.url, y, {"role": role}))
    batch = [
        {"id": x, "criteria": {}},
        {"id": y, "criteria": {"role": "reader"}},
        {"id": y, "criteria": {"role": ""}},
    ]

    status, text, _ = await control(a.url, "criteria", batch)
    assert status == 422
    assert "2.criteria.role:" in text
    assert "0." not in text and "1." not in text

    await post(b.url, "still", [{"role": role}])
    for sock in sockets:
        assert await sock.next_name() == "still"


# -- kicks ----------------------------------------------------------------------------------------


async def test_a_kick_on_one_instance_alerts_and_disconnects_the_id_s_sockets_on_both(
    pair: tuple[Gateway, Gateway], listen: Listen, control: Control, post: Post
) -> None:
    a, b = pair
    x, y = unique("X"), unique("Y")
    kicked = [
        await listen(gateway.url, x, {"role": "r"}, proto=proto)
        for gateway in pair
        for proto in (1, 2)
    ]
    spared = [await listen(gateway.url, y, {"role": "r"}, proto=2) for gateway in pair]

    body = {"ids": [x], "reason": "account closed", "reconnect": "never"}
    status, text, headers = await control(a.url, "disconnect", body)
    assert (status, text) == (204, "")
    assert headers["Bow-Position"]

    info = {"code": 4005, "reason": "kicked", "fatal": True, "reconnect": "never"}
    for sock in kicked:
        await asyncio.wait_for(sock.disconnected.wait(), WAIT)
        if sock.proto == 1:
            assert sock.log == [("alert", ("kicked: account closed",)), ("disconnect", ())]
        else:
            assert sock.log == [("alert", ("account closed", info)), ("disconnect", ())]

    await post(b.url, "after", [{"__id": y}, {"__id": x}])
    for sock in spared:
        assert await sock.next_name() == "after"
        assert sock.client.connected
        assert not sock.disconnected.is_set()


# -- counts ---------------------------------------------------------------------------------------


async def test_a_count_covers_both_instances_whichever_is_asked(
    pair: tuple[Gateway, Gateway], listen: Listen, control: Control
) -> None:
    z = unique("Z")
    for gateway in pair:
        await listen(gateway.url, z, {"role": "r"})
    await listen(pair[0].url, unique("other"), {"role": "r"})
    for gateway in pair:
        status, answer, _ = await control(gateway.url, "count", {"audience": [{"__id": z}]})
        assert (status, answer) == (200, {"sockets": 2, "listeners": 1, "complete": True})


async def test_a_paused_instance_makes_the_count_incomplete_in_time(
    pair: tuple[Gateway, Gateway],
    listen: Listen,
    control: Control,
    http: aiohttp.ClientSession,
) -> None:
    a, b = pair
    z = unique("Z")
    await listen(a.url, z, {"role": "r"})
    await listen(b.url, z, {"role": "r"})
    await listen(b.url, z, {"role": "r"})
    os.kill(b.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        status, answer, _ = await control(a.url, "count", {"audience": [{"__id": z}]})
        took = time.monotonic() - started
    finally:
        os.kill(b.process.pid, signal.SIGCONT)
    # B's two sockets are not counted, and the answer says the count is not complete.
    assert (status, answer) == (200, {"sockets": 1, "listeners": 1, "complete": False})
    assert COUNT_TIMEOUT - 0.05 <= took <= COUNT_TIMEOUT + 0.5, f"the count took {took:.2f} s"
    await until_health(http, pair, 200)


async def test_counts_over_the_rate_get_429_with_retry_after(
    pair: tuple[Gateway, Gateway], control: Control
) -> None:
    _, b = pair  # B: the Redis test, after this one, counts on A
    await asyncio.sleep(1.1)  # api.max_counts_per_second 2: the bucket is full again (2)
    body = {"audience": [{"__id": unique("nobody")}]}
    answers = await asyncio.gather(*(control(b.url, "count", body) for _ in range(3)))
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200, 200, 429]
    for status, data, headers in answers:
        if status == 429:
            assert headers["Retry-After"] == "1"
            assert "api.max_counts_per_second" in data
        else:
            assert data == {"sockets": 0, "listeners": 0, "complete": True}


# -- embedded -------------------------------------------------------------------------------------


async def test_the_embedded_coroutines_act_on_another_instance_s_sockets(
    pair: tuple[Gateway, Gateway],
    redis_server: RedisServer,
    namespace: str,
    start_bow: Callable[[Bow], Awaitable[Bow]],
    listen: Listen,
    post: Post,
) -> None:
    a, b = pair
    bow = await start_bow(standard_bow(base_config(redis=redis_server.url, namespace=namespace)))
    x, old, new = unique("X"), unique("old"), unique("new")
    sockets = [
        await listen(a.url, x, {"role": old}),
        await listen(b.url, x, {"role": old}, proto=2),
    ]

    assert await bow.count([{"role": old}]) == {"sockets": 2, "listeners": 1, "complete": True}
    position = await bow.set_criteria({"id": x, "criteria": {"role": new}})
    assert position
    assert await bow.count([{"role": old}]) == {"sockets": 0, "listeners": 0, "complete": True}
    assert await bow.count([{"role": new}]) == {"sockets": 2, "listeners": 1, "complete": True}
    await post(b.url, "for-old", [{"role": old}])
    await post(a.url, "for-new", [{"role": new}])
    for sock in sockets:
        assert await sock.next_name() == "for-new"

    assert await bow.disconnect([x], reason="bye", reconnect="backoff")
    info = {"code": 4005, "reason": "kicked", "fatal": True, "reconnect": "backoff"}
    for sock in sockets:
        await asyncio.wait_for(sock.disconnected.wait(), WAIT)
    assert sockets[0].log[-2:] == [("alert", ("kicked: bye",)), ("disconnect", ())]
    assert sockets[1].log[-2:] == [("alert", ("bye", info)), ("disconnect", ())]


# -- Redis down (last: it stops the module's Redis) ----------------------------------------------


async def test_redis_down_gets_503_with_retry_after_from_every_endpoint(
    pair: tuple[Gateway, Gateway],
    redis_server: RedisServer,
    control: Control,
    http: aiohttp.ClientSession,
) -> None:
    a, _ = pair
    bodies = {
        "criteria": {"id": "X", "criteria": {}},
        "disconnect": {"ids": ["X"]},
        "count": {"audience": [{"__id": "X"}]},
    }
    await asyncio.to_thread(redis_server.stop)
    try:
        await until_health(http, pair, 503)
        for path, body in bodies.items():
            status, text, headers = await control(a.url, path, body)
            assert status == 503, f"{path}: {status} {text}"
            assert int(headers["Retry-After"]) >= 1, path
    finally:
        await asyncio.to_thread(redis_server.start)
    with contextlib.suppress(TimeoutError):  # so the instances stop quickly
        await until_health(http, pair, 200)
