"""Message ids (contract section 16): every accepted message has one, made by the gateway, in the
``204`` (``Bow-Message-Id``, a batch's ``Bow-Message-Ids``) and in protocol 2's ``meta.id``; the
same when a recovery replays it; unique across processes (instances, restarts) and never reused."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow
from bow_gateway.core.message_ids import new_id, new_ids

from .support import AUTH, PATH, Gateway, base_config, token
from .support.protocol2 import AUTHOR, BLOG_7, BLOG_42, ID, P2, P2Gateway, p2_bow


@pytest.fixture
async def gateway(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> AsyncIterator[P2Gateway]:
    """A protocol-2 gateway, its watcher connected; its clients closed before it stops."""
    started = P2Gateway(Gateway(await start_bow(p2_bow(base_config())), http))
    await started.watch()
    yield started
    await started.close()


async def post(gateway: P2Gateway, body: Any) -> aiohttp.ClientResponse:
    """POST ``body`` to the inbound: the ``204`` (its headers read, its body empty)."""
    async with gateway.http.post(gateway.url + PATH, json=body, headers=AUTH) as response:
        assert response.status == 204, await response.text()
        return response


async def author(gateway: P2Gateway) -> P2:
    client, _ = await gateway.listener(token("USER/1", AUTHOR))
    return client


async def test_a_204_carries_the_id_its_event_carries_in_meta(gateway: P2Gateway) -> None:
    client = await author(gateway)
    response = await post(gateway, {"name": "news", "payload": 1, "audience": BLOG_42})
    message_id = response.headers["Bow-Message-Id"]
    assert ID.fullmatch(message_id), message_id
    assert "Bow-Message-Ids" not in response.headers
    assert await client.expect("news") == (1, {"position": response.headers["Bow-Position"]})
    assert client.ids == [message_id]


async def test_a_batch_answers_its_ids_in_order_separated_by_comma_space(
    gateway: P2Gateway,
) -> None:
    client = await author(gateway)
    batch = [{"name": f"m{n}", "payload": n, "audience": BLOG_42} for n in range(3)]
    response = await post(gateway, batch)
    ids = response.headers["Bow-Message-Ids"].split(", ")
    assert "Bow-Message-Id" not in response.headers
    assert len(set(ids)) == 3 and all(ID.fullmatch(message_id) for message_id in ids)
    for n in range(3):
        await client.expect(f"m{n}")
    assert client.ids == ids


async def test_a_batch_of_one_still_answers_bow_message_ids(gateway: P2Gateway) -> None:
    response = await post(gateway, [{"name": "only", "audience": BLOG_42}])
    assert ID.fullmatch(response.headers["Bow-Message-Ids"])
    assert "Bow-Message-Id" not in response.headers


async def test_an_empty_batch_answers_no_id(gateway: P2Gateway) -> None:
    response = await post(gateway, [])
    assert not {"Bow-Message-Id", "Bow-Message-Ids", "Bow-Position"} & set(response.headers)


async def test_a_batch_of_max_batch_messages_answers_as_many_distinct_ids(
    gateway: P2Gateway,
) -> None:
    batch = [{"name": "bulk", "payload": n, "audience": BLOG_7} for n in range(1_000)]
    response = await post(gateway, batch)
    ids = response.headers["Bow-Message-Ids"].split(", ")
    assert len(ids) == len(set(ids)) == 1_000


async def test_the_same_message_replayed_by_a_recovery_has_the_same_id(
    gateway: P2Gateway,
) -> None:
    client = await author(gateway)
    seen = await post(gateway, {"name": "seen", "audience": BLOG_42})
    await client.expect("seen")
    await client.close()
    missed = await post(gateway, {"name": "missed", "audience": BLOG_42})
    await gateway.settle()
    again, ack = await gateway.listener(
        token("USER/1", AUTHOR), {"since": seen.headers["Bow-Position"]}
    )
    assert ack["recovered"] is True, ack
    assert (await again.expect("missed"))[1]["replayed"] is True
    assert again.ids == [missed.headers["Bow-Message-Id"]]


async def test_each_message_of_many_requests_has_its_own_id(gateway: P2Gateway) -> None:
    ids = [
        (await post(gateway, {"name": "x", "audience": BLOG_7})).headers["Bow-Message-Id"]
        for _ in range(50)
    ]
    assert len(set(ids)) == 50


def test_ids_of_one_process_are_never_reused() -> None:
    ids = [new_id() for _ in range(1_000)] + new_ids(1_000)
    assert len(set(ids)) == 2_000


def test_another_process_draws_another_prefix() -> None:
    """Guards against ids made from a fixed or time-derived prefix: two instances (or an
    instance and its restart) would make the same ids."""
    code = "from bow_gateway.core.message_ids import new_id; print(new_id())"
    made = [
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    ]
    assert made[0] != made[1] and made[0][:12] != made[1][:12], made


def test_a_forked_child_draws_another_prefix() -> None:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.write(write, new_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as pipe:
        theirs = pipe.read()
    assert ID.fullmatch(theirs), theirs
    assert theirs[:12] != new_id()[:12]
