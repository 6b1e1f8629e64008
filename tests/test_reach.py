"""The whole base (contract section 20) as the gateway answers it from the audience index:
``POST /_bow/reach``, a receipt's ``missed`` and a fallback's ``message.undelivered`` over every
matching listener of the base, not only the connected ones. The index is written in its documented
layout (:mod:`.support.audience_index`); the criteria job's own run is in
tests/test_criteria_job_reach.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio

from bow_gateway import Bow

from .support import AUTH, PATH, base_config, standard_bow
from .support.audience_index import drop_namespace, write_index
from .support.mixed_clients import Mixed, next_seen
from .support.webhooks import Receiver, webhook_table

REDIS = "redis://127.0.0.1:6379/0"
BASE = {
    "USER/1": {"role": "admin", "desk": "fx"},
    "USER/2": {"role": "admin", "desk": "rates"},
    "USER/3": {"role": "author", "desk": "fx", "blogs": [42, 7]},
    "USER/4": {"role": "admin", "desk": "fx"},
    "USER/5": {"role": "reader"},
    6: {"role": "admin", "blogs": [42]},
}


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    """A namespace of the shared Redis holding :data:`BASE` as generation ``g1``."""
    name = f"reach-{uuid.uuid4().hex[:8]}"
    client = redis.asyncio.Redis.from_url(REDIS)
    await write_index(client, name, "g1", BASE)
    yield name
    await drop_namespace(client, name)
    await client.aclose()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    started = await Receiver().start()
    yield started
    await started.stop()


@pytest.fixture
def gateway(
    serve_mixed: Callable[..., Awaitable[Mixed]], namespace: str, receiver: Receiver
) -> Callable[..., Awaitable[Mixed]]:
    """``await gateway(**config)``: an instance on the index's namespace, its webhooks to
    ``receiver``."""

    async def start(**config: Any) -> Mixed:
        config = {"redis": REDIS, "namespace": namespace, **config}
        config.setdefault("webhooks", [webhook_table(receiver.url)])
        return await serve_mixed(**config)

    return start


async def reach(gateway: Mixed, body: Any) -> tuple[int, Any]:
    async with gateway.http.post(gateway.url + "/_bow/reach", json=body, headers=AUTH) as answer:
        if answer.content_type == "application/json":
            return answer.status, await answer.json()
        return answer.status, await answer.text()


async def published(gateway: Mixed, audience: list[dict[str, Any]], headers: dict[str, str]) -> str:
    body = {"name": "news", "payload": {"n": 1}, "audience": audience}
    async with gateway.http.post(
        gateway.url + PATH, json=body, headers={**AUTH, **headers}
    ) as response:
        assert response.status == 204, await response.text()
        message_id: str = response.headers["Bow-Message-Id"]
    return message_id


def undelivered(receiver: Receiver) -> list[dict[str, Any]]:
    return [
        seen.body["data"]
        for seen in receiver.received
        if seen.body["type"] == "message.undelivered"
    ]


async def eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        await asyncio.sleep(0.02)


async def test_reach_counts_the_listeners_of_the_base_and_those_connected(
    gateway: Callable[..., Awaitable[Mixed]],
) -> None:
    instance = await gateway()
    await instance.socketio("USER/1", BASE["USER/1"])
    await instance.sse("USER/3", BASE["USER/3"])
    status, answer = await reach(instance, {"audience": [{"role": "admin", "desk": "fx"}]})
    assert status == 200
    assert answer == {"listeners": 2, "online": 1, "generation": "g1", "complete": True}


async def test_reach_ors_queries_and_matches_list_criteria_and_ids(
    gateway: Callable[..., Awaitable[Mixed]],
) -> None:
    instance = await gateway()
    audience = [{"blogs": 42}, {"__id": "USER/5"}, {"__id": "USER/2", "desk": "fx"}]
    status, answer = await reach(instance, {"audience": audience})
    assert (status, answer["listeners"], answer["online"]) == (200, 3, 0)  # USER/3, 6, USER/5


async def test_reach_without_an_index_is_404_saying_so(
    serve_mixed: Callable[..., Awaitable[Mixed]],
) -> None:
    instance = await serve_mixed(redis=REDIS, namespace=f"reach-{uuid.uuid4().hex[:8]}")
    status, text = await reach(instance, {"audience": [{"role": "admin"}]})
    assert status == 404 and "no audience index" in text and "criteria job" in text


async def test_reach_without_redis_is_404(serve_mixed: Callable[..., Awaitable[Mixed]]) -> None:
    status, text = await reach(await serve_mixed(), {"audience": [{"role": "admin"}]})
    assert status == 404 and "no audience index" in text


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"audience": "admins"}, "audience"),
        ({"audience": [{"role": "admin"}], "limit": 3}, "limit: Unknown field"),
        ([], "the body must be"),
    ],
)
async def test_reach_refuses_a_bad_body_with_422_naming_it(
    gateway: Callable[..., Awaitable[Mixed]], body: Any, says: str
) -> None:
    status, text = await reach(await gateway(), body)
    assert status == 422 and says in text


async def test_reach_needs_the_control_credentials(
    gateway: Callable[..., Awaitable[Mixed]],
) -> None:
    instance = await gateway()
    async with instance.http.post(
        instance.url + "/_bow/reach", json={"audience": [{"role": "admin"}]}
    ) as answer:
        assert answer.status == 401


async def test_bow_reach_answers_as_the_endpoint(
    gateway: Callable[..., Awaitable[Mixed]],
) -> None:
    instance = await gateway()
    answer = await instance.bow.reach([{"role": "reader"}])
    assert answer == {"listeners": 1, "online": 0, "generation": "g1", "complete": True}


async def test_bow_reach_without_an_index_is_none(
    start_bow: Callable[[Bow], Awaitable[Bow]],
) -> None:
    bow = await start_bow(standard_bow(base_config()))
    assert await bow.reach([{"role": "admin"}]) is None


async def test_a_receipt_misses_every_listener_of_the_base_it_did_not_reach(
    gateway: Callable[..., Awaitable[Mixed]],
) -> None:
    instance = await gateway()
    here = await instance.socketio("USER/1", BASE["USER/1"])
    message_id = await published(instance, [{"role": "admin"}], {"Bow-Receipt": "1"})
    await next_seen(here)
    deadline = time.monotonic() + 10
    while True:
        answer = await instance.bow.receipt(message_id)
        if answer is not None and answer["state"] == "final":
            break
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert answer["listeners"]["delivered"] == ["USER/1"]
    assert sorted(map(str, answer["listeners"]["missed"])) == ["6", "USER/2", "USER/4"]


async def test_a_fallback_sends_every_listener_of_the_base_that_missed_it(
    gateway: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    instance = await gateway()
    here = await instance.socketio("USER/4", BASE["USER/4"])  # acknowledges
    audience = [{"role": "admin"}, {"__id": "USER/9"}]  # USER/9: named, not in the base
    message_id = await published(instance, audience, {"Bow-Fallback": "1"})
    await next_seen(here)
    await eventually(lambda: bool(undelivered(receiver)), "the fallback")
    [event] = undelivered(receiver)
    assert event["message"] == {"id": message_id, "name": "news", "payload": {"n": 1}}
    assert sorted(map(str, event["listeners"])) == ["6", "USER/1", "USER/2", "USER/9"]
    assert "left_out" not in event


async def test_a_fallback_past_max_listeners_says_how_many_were_left_out(
    gateway: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    instance = await gateway(fallback={"max_listeners": 2})
    await published(instance, [{"role": "admin"}], {"Bow-Fallback": "1"})
    await eventually(lambda: bool(undelivered(receiver)), "the fallback")
    [event] = undelivered(receiver)
    assert len(event["listeners"]) == 2 and event["left_out"] == 2


async def test_fallback_max_listeners_out_of_range_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"fallback.*max_listeners"):
        standard_bow(base_config(fallback={"max_listeners": 0}))


async def test_reach_during_a_generation_swap_answers_from_one_generation_or_the_other(
    gateway: Callable[..., Awaitable[Mixed]], namespace: str
) -> None:
    instance = await gateway(api={"max_counts_per_second": 1_000})
    audience = {"audience": [{"role": "admin"}, {"blogs": 7}]}
    client = redis.asyncio.Redis.from_url(REDIS)
    answers: list[tuple[int, str]] = []

    async def ask_until(generation: str) -> None:
        while not answers or answers[-1][1] != generation:
            status, answer = await reach(instance, audience)
            assert status == 200, answer
            answers.append((answer["listeners"], answer["generation"]))
            await asyncio.sleep(0.01)

    try:
        asking = asyncio.create_task(ask_until("g2"))
        await asyncio.sleep(0.3)
        swapped = {**BASE, "USER/5": {"role": "admin"}, 7: {"role": "admin", "blogs": [7]}}
        del swapped["USER/3"]  # the only one of blog 7 in g1
        await write_index(client, namespace, "g2", swapped)
        await asyncio.wait_for(asking, 10)
    finally:
        await client.aclose()
    assert set(answers) == {(5, "g1"), (6, "g2")}  # 4 admins + USER/3; then 6 admins
    assert answers.index((6, "g2")) > max(i for i, a in enumerate(answers) if a[1] == "g1")
