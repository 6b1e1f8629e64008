"""Enrichers and client publish (``clients.md`` sections 12 and 15): a Flywheel publish passes
through the enrichers exactly as an inbound message does. ``init`` runs once however messages
flow; an enricher changes a publish before it is positioned; one that raises refuses a publish
(the errors frame) as it refuses an inbound POST (``422``); one that hangs is cut off after
``inbound.timeout`` (the errors frame), holding up nothing else.

(What one source alone does is in ``test_enrichers.py`` and ``test_flywheel.py``.) A real gateway
on a free port (the memory backplane), real clients: the Flywheel client written from the seed
alone, python-socketio.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow

from .support import AUTH, PASSWORD, PATH, REALM, USER, base_config
from .support.mixed_clients import EQ, FX, TO_FX, Mixed, mixed_bow, next_seen, seen_until

Start = Callable[..., Awaitable[Mixed]]


@pytest.fixture
async def start(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> AsyncIterator[Start]:
    """``gateway = await start(enrichers, timeout=...)``: :func:`mixed_bow` with the enrichers
    ``[(filter, enrich, init)]`` and ``inbound.timeout``."""
    started: list[Mixed] = []

    async def start_(enrichers: list[tuple[str, Any, Any]], *, timeout: float = 5.0) -> Mixed:
        inbound = {"realm": REALM, "username": USER, "password": PASSWORD, "timeout": timeout}
        bow = mixed_bow(base_config(inbound=inbound))
        for topic_filter, enrich, init in enrichers:
            bow.enricher(filter=topic_filter, enrich=enrich, init=init)
        gateway = Mixed("A", await start_bow(bow), http)
        started.append(gateway)
        return gateway

    yield start_
    for gateway in started:
        await gateway.close()


async def post(gateway: Mixed, body: Any) -> tuple[int, str]:
    async with gateway.http.post(gateway.url + PATH, json=body, headers=AUTH) as response:
        return response.status, await response.text()


def errors_of(seen: tuple[str, Any, Any], session: str = "anon") -> dict[str, Any]:
    """The one error of an errors frame (``R $remote/{session}/rx/errors [...]``)."""
    name, errors, _ = seen
    assert name == f"$remote/{session}/rx/errors", seen
    [error] = errors
    assert error["type"] == "TopicAccess", error
    return dict(error)


async def test_init_runs_once_while_flywheel_publishes_and_inbound_messages_flow(
    start: Start,
) -> None:
    calls: list[str] = []

    async def setup() -> None:
        await asyncio.sleep(0)
        calls.append("init")

    def stamp(message: dict[str, Any]) -> dict[str, Any]:
        assert calls == ["init"]  # before any message
        return {**message, "payload": {**message["payload"], "enriched": True}}

    gateway = await start([("quotes/#", stamp, setup), ("quotes/+", stamp, setup)])
    assert calls == ["init"]
    publisher = await gateway.flywheel("T1", FX, subscribe=["quotes/#"])
    watcher = await gateway.flywheel("T2", FX, subscribe=["quotes/#"])

    async def publish() -> None:
        for n in range(10):
            await publisher.publish("quotes/published", json.dumps({"n": n}))

    async def push() -> None:
        for n in range(10):
            await gateway.push({"name": "quotes/pushed", "payload": {"n": n}, "audience": TO_FX})

    await asyncio.gather(publish(), push())
    received = [await next_seen(watcher) for _ in range(20)]
    assert sorted((name, payload["n"]) for name, payload, _ in received) == sorted(
        (name, n) for name in ("quotes/published", "quotes/pushed") for n in range(10)
    )
    assert all(payload["enriched"] for _, payload, _ in received)
    assert calls == ["init"]


async def test_an_enricher_changes_a_flywheel_publish_before_it_is_delivered(
    start: Start,
) -> None:
    def to_eq(message: dict[str, Any]) -> dict[str, Any]:
        return {**message, "payload": {**message["payload"], "seen": True}, "audience": [EQ]}

    gateway = await start([("quotes/#", to_eq, None)])
    publisher = await gateway.flywheel("T1", FX, subscribe=["quotes/#", "news/#"])
    eq = await gateway.flywheel("T2", EQ, subscribe=["quotes/#"])
    await publisher.publish("quotes/x", '{"bid": 1}')  # the hook's audience: the FX desk
    assert (await next_seen(eq))[:2] == ("quotes/x", {"bid": 1, "seen": True})
    await gateway.push({"name": "news/end", "payload": 0, "audience": TO_FX})
    assert (await next_seen(publisher))[:2] == ("news/end", 0)  # never its own quote


async def test_an_enricher_that_raises_refuses_a_flywheel_publish_and_an_inbound_post_alike(
    start: Start,
) -> None:
    def refuse(message: dict[str, Any]) -> dict[str, Any]:
        raise LookupError("closed market")

    gateway = await start([("quotes/#", refuse, None)])
    publisher = await gateway.flywheel("T1", FX, subscribe=["quotes/#", "news/#"])
    socketio = await gateway.socketio("SIO", FX)

    await publisher.publish("quotes/x", '{"bid": 1}')
    error = errors_of(await next_seen(publisher))
    status, text = await post(gateway, {"name": "quotes/y", "payload": 2, "audience": TO_FX})

    refused = "the enricher tests.test_enrichers_publish:"
    assert error["topic"] == "quotes/x"
    assert error["description"].startswith(refused), error
    assert error["description"].endswith(".refuse refused the message: closed market"), error
    assert status == 422
    assert text == "422: " + error["description"]  # the same words either way
    await gateway.push({"name": "news/end", "payload": 0, "audience": TO_FX})
    assert (await next_seen(publisher))[:2] == ("news/end", 0)
    assert await seen_until(socketio, "news/end") == []  # neither was accepted


async def test_a_hanging_enricher_cuts_off_a_flywheel_publish_after_inbound_timeout(
    start: Start,
) -> None:
    async def hang(message: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(60)
        return message

    timeout = 0.5
    gateway = await start([("quotes/slow/#", hang, None)], timeout=timeout)
    publisher = await gateway.flywheel("T1", FX, subscribe=["quotes/#"], session="s-1")
    watcher = await gateway.flywheel("T2", FX, subscribe=["quotes/#"])

    started = time.monotonic()
    await publisher.publish("quotes/slow/x", '{"bid": 1}')
    error = errors_of(await next_seen(publisher), "s-1")
    elapsed = time.monotonic() - started

    assert timeout <= elapsed < timeout + 1.5, elapsed
    assert error["topic"] == "quotes/slow/x"
    assert error["description"].endswith(".hang did not answer within 0.5 s"), error
    await publisher.publish("quotes/fast", '{"bid": 2}')  # the connection goes on
    for client in (publisher, watcher):
        assert (await next_seen(client))[:2] == ("quotes/fast", {"bid": 2})


async def test_a_hanging_publish_holds_up_no_other_message(start: Start) -> None:
    release = asyncio.Event()

    async def hold(message: dict[str, Any]) -> dict[str, Any]:
        await release.wait()
        return message

    gateway = await start([("quotes/slow/#", hold, None)], timeout=60)
    publisher = await gateway.flywheel("T1", FX, subscribe=["quotes/#"])
    other = await gateway.flywheel("T2", FX, subscribe=["quotes/#"])
    await publisher.publish("quotes/slow/x", '{"bid": 1}')
    # while that publish is held: another connection's publish, then an inbound message
    await other.publish("quotes/other", '{"bid": 2}')
    for client in (publisher, other):
        assert (await next_seen(client))[:2] == ("quotes/other", {"bid": 2})
    await gateway.push({"name": "quotes/pushed", "payload": {"bid": 3}, "audience": TO_FX})
    for client in (publisher, other):
        assert (await next_seen(client))[:2] == ("quotes/pushed", {"bid": 3})
    release.set()
    for client in (publisher, other):
        assert (await next_seen(client))[:2] == ("quotes/slow/x", {"bid": 1})
