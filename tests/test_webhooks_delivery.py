"""Delivery through the webhooks engine in one process (the in-process store), to a real aiohttp
receiver that verifies every request with the ``standardwebhooks`` library: signatures, the body,
retries and their backoff, ``Retry-After``, dead letters, the order of one key, the backlog
bound, the logs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

import pytest

from bow_gateway.core.webhook_settings import Webhook
from bow_gateway.runtime.metrics import Metrics
from bow_gateway.runtime.supervisor import Supervisor
from bow_gateway.webhooks import WebhookEvent, Webhooks
from bow_gateway.webhooks.store_memory import MemoryWebhookStore

from .support import until
from .support.webhooks import ALL_TYPES, WH_SECRET, Answering, Received, Receiver

Start = Callable[..., Awaitable[Webhooks]]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    receiver = await Receiver().start()
    yield receiver
    await receiver.stop()


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    """``await start(url, max_backlog=..., **webhook_options)``: a started engine, short timings."""
    started: list[Webhooks] = []
    supervisor = Supervisor()

    async def make(*urls: str, max_backlog: int = 100_000, **options: Any) -> Webhooks:
        hooks = [Webhook(url, WH_SECRET, frozenset(ALL_TYPES), **options) for url in urls]
        store = MemoryWebhookStore(max_backlog=max_backlog)
        engine = Webhooks(
            hooks, store, Metrics(), backoff_base=0.02, backoff_cap=0.2, renew_every=0.1, tick=0.05
        )
        await engine.start(supervisor.start)
        started.append(engine)
        return engine

    yield make
    for engine in started:
        await engine.stop()


def receipt(n: int, key: str = "") -> WebhookEvent:
    return WebhookEvent("message.receipt", {"n": n}, key)


def answers(*statuses: int, then: int = 204, **headers: str) -> Answering:
    """The receiver answers ``statuses`` in turn (with ``headers``), then ``then``."""
    return lambda seen, body: (statuses[len(seen)] if len(seen) < len(statuses) else then, headers)


async def test_every_request_verifies_with_the_standard_webhooks_library(
    receiver: Receiver, start: Start
) -> None:
    engine = await start(receiver.url)
    await engine.emit([receipt(n) for n in range(20)])
    await receiver.wait_for(20)
    assert receiver.unverified == 0
    assert len(set(receiver.ids())) == 20


async def test_the_body_is_type_timestamp_and_data(receiver: Receiver, start: Start) -> None:
    engine = await start(receiver.url)
    await engine.emit([WebhookEvent("listener.online", {"id": "U/1", "protocol": "sse"}, at=0.5)])
    await receiver.wait_for(1)
    body = receiver.received[0].body
    assert body == {
        "type": "listener.online",
        "timestamp": "1970-01-01T00:00:00.500Z",
        "data": {"id": "U/1", "protocol": "sse"},
    }
    assert datetime.fromisoformat(body["timestamp"]).timestamp() == 0.5


async def test_a_5xx_is_retried_with_the_same_webhook_id_until_delivered(
    receiver: Receiver, start: Start
) -> None:
    receiver.answer = answers(503, 500, 502)
    engine = await start(receiver.url)
    await engine.emit([receipt(1)])
    await receiver.wait_for(4)
    assert len(set(receiver.ids())) == 1
    await asyncio.sleep(0.1)
    assert len(receiver.received) == 4 and await engine.dead() == []


async def test_retry_after_is_honoured_over_the_backoff(receiver: Receiver, start: Start) -> None:
    receiver.answer = answers(429, **{"Retry-After": "1"})
    engine = await start(receiver.url)
    await engine.emit([receipt(1)])
    await receiver.wait_for(2, timeout=5)
    first, second = receiver.received
    assert 0.9 <= second.at - first.at < 2.0  # the backoff alone would be under 0.02 s


async def test_a_4xx_makes_a_dead_letter_at_once(receiver: Receiver, start: Start) -> None:
    receiver.answer = answers(then=400)
    engine = await start(receiver.url)
    await engine.emit([receipt(1)])
    await until(lambda: bool(engine.store._dead), "a dead letter")  # type: ignore[attr-defined]
    (dead,) = await engine.dead()
    assert dead["id"] == receiver.ids()[0]
    assert (dead["attempts"], dead["last_status"], dead["last_error"]) == (1, 400, "HTTP 400")
    assert (dead["url"], dead["type"]) == (receiver.url, "message.receipt")
    assert datetime.fromisoformat(dead["created_at"])
    assert len(receiver.received) == 1


async def test_max_attempts_of_5xx_make_a_dead_letter_with_the_last_status(
    receiver: Receiver, start: Start
) -> None:
    receiver.answer = answers(then=503)
    engine = await start(receiver.url, max_attempts=3)
    await engine.emit([receipt(1)])
    await until(lambda: bool(engine.store._dead), "a dead letter")  # type: ignore[attr-defined]
    (dead,) = await engine.dead()
    assert (dead["attempts"], dead["last_status"], dead["last_error"]) == (3, 503, "HTTP 503")
    assert len(receiver.received) == 3


async def test_a_receiver_that_is_down_makes_a_dead_letter_without_a_status(
    start: Start,
) -> None:
    engine = await start(Receiver().url, max_attempts=2)  # nothing listens there
    await engine.emit([receipt(1)])
    await until(lambda: bool(engine.store._dead), "a dead letter")  # type: ignore[attr-defined]
    (dead,) = await engine.dead()
    assert (dead["attempts"], dead["last_status"]) == (2, None)
    assert "ClientConnectorError" in dead["last_error"]


async def test_one_keys_events_arrive_in_order_under_retries_without_blocking_others(
    receiver: Receiver, start: Start
) -> None:
    def answer(seen: list[Received], body: dict[str, Any]) -> tuple[int, dict[str, str]]:
        tries = [s for s in seen if s.body["data"] == {"n": 0}]  # the key's first event
        return (503 if body["data"] == {"n": 0} and len(tries) < 2 else 204), {}

    receiver.answer = answer
    engine = await start(receiver.url)
    await engine.emit([receipt(n, "k") for n in range(5)] + [receipt(99)])
    await receiver.wait_for(8)
    order = [seen.body["data"]["n"] for seen in receiver.received]
    keyed = [n for n in order if n != 99]
    assert keyed == [0, 0, 0, 1, 2, 3, 4]
    assert order.index(99) < 3  # the unkeyed event did not wait for the key's retries


async def test_at_the_backlog_bound_an_event_is_a_dead_letter_at_once(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    engine = await start(Receiver().url, max_backlog=2, max_attempts=100)  # nobody answers
    with caplog.at_level(logging.WARNING, "bow_gateway.webhooks"):
        await engine.emit([receipt(n) for n in range(3)])
        await until(lambda: bool(engine.store._dead), "a dead letter")  # type: ignore[attr-defined]
    (dead,) = await engine.dead()
    assert dead["attempts"] == 0 and dead["last_status"] is None
    assert "backlog was full" in dead["last_error"]
    assert "backlog was full" in caplog.text


async def test_no_secret_signature_or_password_is_logged(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    url = Receiver().url.replace("http://", "http://user:hunter2pass@")
    with caplog.at_level(logging.DEBUG):
        engine = await start(url, max_attempts=2)
        await engine.emit([receipt(1)])
        await until(lambda: bool(engine.store._dead), "a dead letter")  # type: ignore[attr-defined]
    (dead,) = await engine.dead()
    assert "hunter2pass" not in dead["url"] + dead["last_error"]
    assert "dead letter" in caplog.text
    for secret in ("hunter2pass", WH_SECRET, WH_SECRET.removeprefix("whsec_"), "v1,"):
        assert secret not in caplog.text


async def test_without_webhooks_nothing_is_wanted_nor_run() -> None:
    engine = Webhooks((), MemoryWebhookStore(), Metrics())
    tasks = asyncio.all_tasks()
    await engine.start(Supervisor().start)
    assert not engine.wants("listener.online")
    assert asyncio.all_tasks() == tasks
    await engine.emit([receipt(1)])
    assert await engine.store.depth() == 0
    await engine.stop()


async def test_only_the_types_a_webhook_takes_are_wanted() -> None:
    hook = Webhook("http://127.0.0.1:9/", WH_SECRET, frozenset({"listener.offline"}))
    engine = Webhooks([hook], MemoryWebhookStore(), Metrics())
    assert engine.wants("listener.offline") and not engine.wants("listener.online")
    with pytest.raises(ValueError, match="not a webhook event type"):
        await engine.emit([WebhookEvent("nope", {})])
