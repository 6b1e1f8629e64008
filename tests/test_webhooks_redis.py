"""Webhooks on Redis (a private redis-server): events stored durably by ``emit``, one instance
delivering at a time under a lease, another taking over when it dies, its pending events
claimed; and the big one, two gateway processes, the one holding 1,000 events SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio

from bow_gateway import Bow
from bow_gateway.backplanes import BackplaneUnavailable
from bow_gateway.core.webhook_settings import Webhook
from bow_gateway.runtime.metrics import Metrics
from bow_gateway.runtime.supervisor import Supervisor
from bow_gateway.webhooks import WebhookEvent, Webhooks
from bow_gateway.webhooks.store_redis import RedisWebhookStore, stream_keys

from .support import base_config, standard_bow, until
from .support.instances import Gateway, gateway_env
from .support.redis_server import RedisServer
from .support.webhooks import ALL_TYPES, WH_SECRET, Receiver, webhook_table


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    yield receiver
    await receiver.stop()


def engine(server: RedisServer, namespace: str, url: str, **options: float) -> Webhooks:
    """An engine on ``server`` with short timings: a 1 s lease, fast retries."""
    hook = Webhook(url, WH_SECRET, frozenset(ALL_TYPES), max_attempts=100)
    store = RedisWebhookStore(server.url, namespace=namespace, lease_ttl=1.0)
    return Webhooks(
        [hook], store, Metrics(), renew_every=0.2, backoff_base=0.05, backoff_cap=0.2, tick=0.1
    )


def receipts(count: int, key: str = "") -> list[WebhookEvent]:
    return [WebhookEvent("message.receipt", {"n": n}, key) for n in range(count)]


async def test_emit_returns_once_redis_holds_the_events(redis_server: RedisServer) -> None:
    namespace = uuid.uuid4().hex
    one = engine(redis_server, namespace, "http://127.0.0.1:9/")
    await one.emit(receipts(5))
    assert redis_server.command("XLEN", stream_keys(namespace)[0]) == ":5"
    await one.stop()


async def test_emit_raises_backplane_unavailable_when_redis_is_down() -> None:
    with RedisServer() as server:
        one = engine(server, "down", "http://127.0.0.1:9/")
        server.stop()
        with pytest.raises(BackplaneUnavailable):
            await one.emit(receipts(1))
        await one.stop()


async def test_one_instance_holds_the_lease_until_it_gives_it_up(
    redis_server: RedisServer,
) -> None:
    namespace = uuid.uuid4().hex
    first, second = (RedisWebhookStore(redis_server.url, namespace=namespace) for _ in range(2))
    assert await first.hold() and not await second.hold()
    assert await first.hold()  # renewed
    await first.release()
    assert await second.hold()
    await first.close()
    await second.close()


async def test_another_instance_takes_over_a_dead_ones_pending_events_in_order(
    redis_server: RedisServer, receiver: Receiver
) -> None:
    namespace = uuid.uuid4().hex
    first = engine(redis_server, namespace, receiver.url)
    await first.start(Supervisor().start)
    await until(lambda: redis_server.command("EXISTS", f"{{{namespace}}}:webhooks:lease") == ":1")
    unkeyed = [WebhookEvent("message.receipt", {"n": 100 + n}) for n in range(50)]
    await first.emit(receipts(50, key="k") + unkeyed)
    key = stream_keys(namespace)[0]
    await until(lambda: redis_server.command("XPENDING", key, "deliver", first_line=False)
                .startswith("*4\r\n:"), "the events read")  # fmt: skip
    assert first._task is not None
    first._task.cancel()  # dies: no release, no write back
    second = engine(redis_server, namespace, receiver.url)
    await second.start(Supervisor().start)
    await receiver.start()
    await receiver.wait_for(100, timeout=15)
    assert len(set(receiver.ids())) == 100 and receiver.unverified == 0
    keyed = [seen.body["data"]["n"] for seen in receiver.received if seen.body["data"]["n"] < 100]
    assert keyed == list(range(50))  # the key's events in order, across the takeover
    await until(lambda: redis_server.command("XLEN", key) == ":0", "the stream emptied")
    await second.stop()
    await first.stop()


async def test_a_gateway_on_redis_delivers_what_its_embedded_twin_emitted(
    start_bow: object, redis_server: RedisServer, receiver: Receiver
) -> None:
    await receiver.start()
    config = base_config(
        redis=redis_server.url,
        namespace=uuid.uuid4().hex,
        webhooks=[webhook_table(receiver.url)],
    )
    bow = standard_bow(config)
    await bow.start()
    try:
        assert bow._webhooks is not None
        await bow._webhooks.emit(receipts(10))
        await receiver.wait_for(10)
    finally:
        await bow.stop()
    assert len(set(receiver.ids())) == 10


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_killed_instances_1000_pending_events_are_delivered_once_by_another(
    tmp_path: Path, receiver: Receiver
) -> None:
    with RedisServer() as server:
        namespace = "killed"
        env = gateway_env(
            server.url, namespace, BOW_WEBHOOKS=json.dumps([webhook_table(receiver.url)])
        )
        holder = Gateway(env, tmp_path / "holder.log")
        holder.wait_healthy()
        lease = f"{{{namespace}}}:webhooks:lease"
        await until(lambda: server.command("EXISTS", lease) == ":1", "the holder's lease")
        other = Gateway(env, tmp_path / "other.log")
        try:
            other.wait_healthy()
            await emit_from_an_embedded_gateway(server, namespace, receiver.url, 1_000)
            client = redis.asyncio.Redis.from_url(server.url)
            key = stream_keys(namespace)[0]

            async def pending() -> int:
                summary = await client.xpending(key, "deliver")
                return int(summary["pending"])

            for _ in range(1_000):  # the holder has read them all (and fails to send them)
                if await pending() == 1_000:
                    break
                await asyncio.sleep(0.02)
            assert await pending() == 1_000
            holder.kill()
            killed = time.monotonic()
            await receiver.start()
            await receiver.wait_for(1_000, timeout=45)
            took = time.monotonic() - killed
            await asyncio.sleep(1.0)  # any repeat would come now
            assert len(set(receiver.ids())) == 1_000
            assert len(receiver.received) == 1_000, "repeats after the takeover"
            assert receiver.unverified == 0
            assert took < 30, f"the takeover took {took:.1f} s"
            await until(lambda: server.command("XLEN", key) == ":0", "the stream emptied")
            await client.aclose()
        finally:
            other.stop()
            holder.kill()


async def emit_from_an_embedded_gateway(
    server: RedisServer, namespace: str, url: str, count: int
) -> None:
    """``count`` events emitted by a gateway of this process on the same Redis, then stopped."""
    config = base_config(redis=server.url, namespace=namespace, webhooks=[webhook_table(url)])
    bow: Bow = standard_bow(config)
    await bow.start()
    try:
        assert bow._webhooks is not None
        for start in range(0, count, 100):
            await bow._webhooks.emit(
                [WebhookEvent("message.receipt", {"n": n}) for n in range(start, start + 100)]
            )
    finally:
        await bow.stop()
