"""``GET /_bow/webhooks/dead`` and ``POST /_bow/webhooks/replay`` on a real gateway, behind the
inbounds' Basic Auth, and their embedded twins ``Bow.webhooks_dead`` and ``webhooks_replay``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow
from bow_gateway.webhooks import WebhookEvent

from .support import AUTH, base_config, standard_bow, until
from .support.webhooks import Receiver, webhook_table

DEAD = "/_bow/webhooks/dead"
REPLAY = "/_bow/webhooks/replay"


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    receiver = await Receiver(answer=lambda seen, body: (400, {})).start()
    yield receiver
    await receiver.stop()


@pytest.fixture
async def gateway(start_bow: Callable[[Bow], Awaitable[Bow]], receiver: Receiver) -> Bow:
    """A gateway whose webhook refuses everything (400) until told otherwise: two dead letters."""
    bow = await start_bow(standard_bow(base_config(webhooks=[webhook_table(receiver.url)])))
    assert bow._webhooks is not None
    await bow._webhooks.emit([WebhookEvent("message.receipt", {"n": n}) for n in range(2)])
    await until(lambda: len(receiver.received) == 2, "two requests")
    for _ in range(500):  # the dead letters are written back in a batch, a moment later
        if len(await bow.webhooks_dead()) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(await bow.webhooks_dead()) == 2
    return bow


async def get(http: aiohttp.ClientSession, bow: Bow, query: str = "") -> tuple[int, Any]:
    async with http.get(f"http://127.0.0.1:{bow.port}{DEAD}{query}", headers=AUTH) as response:
        return response.status, await (response.json() if response.ok else response.text())


async def post(http: aiohttp.ClientSession, bow: Bow, body: Any) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{bow.port}{REPLAY}"
    async with http.post(url, json=body, headers=AUTH) as response:
        return response.status, await (response.json() if response.ok else response.text())


async def test_dead_lists_the_oldest_first_with_their_fields(
    gateway: Bow, http: aiohttp.ClientSession, receiver: Receiver
) -> None:
    status, answer = await get(http, gateway, "?limit=1")
    assert status == 200
    (first,) = answer["dead"]
    assert first["id"] == receiver.ids()[0]
    assert (first["url"], first["type"], first["attempts"], first["last_status"]) == (
        receiver.url,
        "message.receipt",
        1,
        400,
    )
    assert (await get(http, gateway))[1]["dead"][1]["id"] == receiver.ids()[1]


async def test_a_replay_sends_the_event_again_with_its_webhook_id(
    gateway: Bow, http: aiohttp.ClientSession, receiver: Receiver
) -> None:
    first = receiver.ids()[0]
    receiver.answer = lambda seen, body: (204, {})
    assert await post(http, gateway, {"ids": [first, "msg_unknown"]}) == (200, {"replayed": 1})
    await receiver.wait_for(3)
    assert receiver.ids()[2] == first and receiver.received[2].body["data"] == {"n": 0}
    _, answer = await get(http, gateway)
    assert [dead["id"] for dead in answer["dead"]] == [receiver.ids()[1]]


@pytest.mark.parametrize("query", ["?limit=0", "?limit=10001", "?limit=ten", "?limit=-1"])
async def test_a_bad_limit_is_422_naming_it(
    gateway: Bow, http: aiohttp.ClientSession, query: str
) -> None:
    status, text = await get(http, gateway, query)
    assert status == 422 and "limit: an integer from 1 to 10000" in text


@pytest.mark.parametrize("body", [[], {"ids": "msg_1"}, {"ids": [1]}, {"id": []}])
async def test_a_bad_replay_body_is_422(
    gateway: Bow, http: aiohttp.ClientSession, body: Any
) -> None:
    status, text = await post(http, gateway, body)
    assert status == 422 and "ids" in text


async def test_both_need_the_inbounds_credentials(
    gateway: Bow, http: aiohttp.ClientSession
) -> None:
    base = f"http://127.0.0.1:{gateway.port}"
    async with http.get(base + DEAD) as dead, http.post(base + REPLAY, json={"ids": []}) as replay:
        assert (dead.status, replay.status) == (401, 401)


async def test_the_embedded_twins_list_and_replay(gateway: Bow, receiver: Receiver) -> None:
    (first,) = await gateway.webhooks_dead(limit=1)
    receiver.answer = lambda seen, body: (204, {})
    assert await gateway.webhooks_replay([first["id"]]) == 1
    await receiver.wait_for(3)
    with pytest.raises(ValueError, match="limit"):
        await gateway.webhooks_dead(limit=0)
