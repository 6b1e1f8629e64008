"""Background tasks under supervision (bow_gateway/runtime/supervisor.py), in a real gateway."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from bow_gateway import Bow
from bow_gateway.backplanes import Entry, Gap, MemoryBackplane
from bow_gateway.runtime.supervisor import Supervisor

from .support import AUTH, PATH, Listener, base_config, read_metric, standard_bow, token

StartBow = Callable[[Bow], Awaitable[Bow]]


class FlakyReads(MemoryBackplane):
    """The in-process backplane, whose reads fail while ``failing`` is set; what it read when
    they failed is read again next time (as the Redis stream's cursor would)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False
        self._unread: list[Entry | Gap] = []

    async def events(self) -> AsyncIterator[Entry | Gap]:
        reads = super().events()
        while True:
            if not self._unread:
                try:
                    self._unread.append(await anext(reads))
                except StopAsyncIteration:
                    return
            if self.failing:
                raise ConnectionError("the test broke the backplane's reads")
            yield self._unread.pop(0)


async def until_health(http: aiohttp.ClientSession, url: str, status: int) -> None:
    async with asyncio.timeout(10):
        while True:
            async with http.get(url + "/health") as response:
                if response.status == status:
                    return
            await asyncio.sleep(0.02)


async def test_a_dead_consumer_is_restarted_health_is_503_meanwhile_and_nothing_is_lost(
    start_bow: StartBow, caplog: pytest.LogCaptureFixture
) -> None:
    backplane = FlakyReads()
    bow = await start_bow(standard_bow(base_config(), backplane))
    url = f"http://127.0.0.1:{bow.port}"
    listener = Listener(url)
    await listener.connect()
    await listener.authenticate(token("USER/1"))
    audience = [{"__id": "USER/1"}]
    async with aiohttp.ClientSession() as http:
        backplane.failing = True
        async with http.post(
            url + PATH, json={"name": "during", "audience": audience}, headers=AUTH
        ) as response:
            assert response.status == 204
        await until_health(http, url, 503)
        backplane.failing = False
        await until_health(http, url, 200)
        async with http.post(
            url + PATH, json={"name": "after", "audience": audience}, headers=AUTH
        ) as response:
            assert response.status == 204
        assert [(await listener.next_event())[0] for _ in range(2)] == ["during", "after"]
        restarts = 'bow_task_restarts_total{task="backplane consumer"}'
        assert await read_metric(http, url, restarts) >= 1
    await listener.close()
    died = [r for r in caplog.records if r.name == "bow_gateway.supervisor"]
    assert died and died[0].exc_info is not None  # logged with its traceback


async def test_a_task_that_returns_is_not_restarted() -> None:
    runs = 0

    async def job() -> None:
        nonlocal runs
        runs += 1

    await Supervisor().start("once", job)
    assert runs == 1


async def test_restarts_back_off_up_to_the_cap(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    starts: list[float] = []
    loop = asyncio.get_running_loop()

    async def job() -> None:
        starts.append(loop.time())
        if len(starts) < 5:
            raise RuntimeError("dies")

    await Supervisor(first_delay=0.02, max_delay=0.08).start("flaky", job)
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert gaps[0] >= 0.02 and gaps[1] >= 0.04 and gaps[2] >= 0.08 and gaps[3] >= 0.08
    assert gaps[3] < 0.5  # capped
    assert len(caplog.records) == 4
