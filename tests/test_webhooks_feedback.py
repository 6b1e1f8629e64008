"""The webhook events the gateway makes (contract section 19): ``listener.online`` and
``listener.offline`` with ``presence.offline_grace``, in order per id, across two instances;
``message.receipt`` once a receipt is final; ``message.undelivered`` for ``Bow-Fallback``. Each
request checked by the ``standardwebhooks`` library (:mod:`.support.webhooks`)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from bow_gateway import Bow

from .support import AUTH, PATH
from .support.mixed_clients import Mixed, next_seen
from .support.webhooks import Receiver, webhook_table

StartBow = Callable[[Bow], Awaitable[Bow]]
FX = {"desk": "fx"}
TO_FX = [{"desk": "fx"}]
GRACE = 0.5  # seconds of presence.offline_grace in these tests


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    started = await Receiver().start()
    yield started
    await started.stop()


@pytest.fixture
def gateways(
    serve_mixed: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> Callable[..., Awaitable[Mixed]]:
    """``await gateways(**config)``: a gateway of every protocol sending every webhook type to
    ``receiver``, with a short ``presence.offline_grace``."""

    async def start(**config: Any) -> Mixed:
        config.setdefault("webhooks", [webhook_table(receiver.url)])
        config.setdefault("presence", {"offline_grace": GRACE})
        return await serve_mixed(**config)

    return start


def of_type(receiver: Receiver, kind: str) -> list[dict[str, Any]]:
    return [seen.body["data"] for seen in receiver.received if seen.body["type"] == kind]


def presence_of(receiver: Receiver, listener_id: str) -> list[str]:
    """The online and offline events of ``listener_id``, in the order they came."""
    return [
        seen.body["type"].removeprefix("listener.")
        for seen in receiver.received
        if seen.body["type"].startswith("listener.") and seen.body["data"]["id"] == listener_id
    ]


async def settle(receiver: Receiver, seconds: float) -> None:
    """Let ``seconds`` pass, with what they bring."""
    count = len(receiver.received)
    await asyncio.sleep(seconds)
    assert len(receiver.received) >= count


async def eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        await asyncio.sleep(0.02)


async def test_the_first_socket_of_an_id_sends_online_with_its_protocol(
    gateways: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    gateway = await gateways()
    await gateway.socketio("USER/1", FX)
    await gateway.flywheel("USER/1", FX)  # a second socket: nothing more
    await eventually(lambda: bool(of_type(receiver, "listener.online")), "online")
    await settle(receiver, 0.3)
    assert of_type(receiver, "listener.online") == [{"id": "USER/1", "protocol": "socketio"}]


async def test_offline_comes_only_after_the_grace(
    gateways: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    gateway = await gateways()
    client = await gateway.socketio("USER/1", FX)
    await eventually(lambda: presence_of(receiver, "USER/1") == ["online"], "online")
    await client.close()
    gone = time.monotonic()
    await eventually(lambda: presence_of(receiver, "USER/1") == ["online", "offline"], "offline")
    [offline] = [seen for seen in receiver.received if seen.body["type"] == "listener.offline"]
    assert offline.at - gone >= GRACE
    assert offline.body["data"] == {"id": "USER/1"}


async def test_a_blink_within_the_grace_sends_nothing(
    gateways: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    gateway = await gateways()
    first = await gateway.socketio("USER/1", FX)
    await eventually(lambda: presence_of(receiver, "USER/1") == ["online"], "online")
    await first.close()
    await gateway.socketio("USER/1", FX)  # back within the grace
    await settle(receiver, GRACE * 3)
    assert presence_of(receiver, "USER/1") == ["online"]


async def test_online_and_offline_alternate_in_order_for_an_id(
    gateways: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    gateway = await gateways()
    for _ in range(3):
        client = await gateway.socketio("USER/1", FX)
        await eventually(lambda: presence_of(receiver, "USER/1")[-1:] == ["online"], "online")
        await client.close()
        await eventually(lambda: presence_of(receiver, "USER/1")[-1:] == ["offline"], "offline")
    assert presence_of(receiver, "USER/1") == ["online", "offline"] * 3


async def test_a_reconnect_to_another_instance_is_no_offline(
    gateways: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    config = {"redis": "redis://127.0.0.1:6379/0", "namespace": f"online-{uuid.uuid4().hex[:8]}"}
    first, second = await gateways(**config), await gateways(**config)
    client = await first.socketio("USER/1", FX)
    await eventually(lambda: presence_of(receiver, "USER/1") == ["online"], "online")
    await client.close()
    await second.flywheel("USER/1", FX)  # the same listener, now on the other instance
    await settle(receiver, GRACE * 4)
    assert presence_of(receiver, "USER/1") == ["online"]
    assert [seen.webhook_id for seen in receiver.received if seen.body["type"] == "listener.online"]


async def test_an_id_online_on_two_instances_goes_offline_once_both_left(
    gateways: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    config = {"redis": "redis://127.0.0.1:6379/0", "namespace": f"online-{uuid.uuid4().hex[:8]}"}
    first, second = await gateways(**config), await gateways(**config)
    one = await first.socketio("USER/1", FX)
    two = await second.socketio("USER/1", FX)
    await eventually(lambda: presence_of(receiver, "USER/1") == ["online"], "online")
    await one.close()
    await settle(receiver, GRACE * 3)
    assert presence_of(receiver, "USER/1") == ["online"]  # still on the second
    await two.close()
    await eventually(lambda: presence_of(receiver, "USER/1") == ["online", "offline"], "offline")


async def test_the_ids_of_an_instance_that_died_go_offline(
    gateways: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    """An instance gone without closing its sockets (its heartbeats stopped): another's sweep
    takes its sockets away, and their ids go offline after the grace."""
    config = {"redis": "redis://127.0.0.1:6379/0", "namespace": f"online-{uuid.uuid4().hex[:8]}"}
    first, second = await gateways(**config), await gateways(**config)
    await second.socketio("USER/2", FX)
    await eventually(lambda: presence_of(receiver, "USER/2") == ["online"], "online")
    outbound = second.bow._outbound
    assert outbound is not None
    outbound.admission.arrivals = None  # it says nothing more, as a killed process would not
    await second.bow._backplane.disconnect()  # type: ignore[union-attr]  # no more heartbeats
    await eventually(
        lambda: presence_of(receiver, "USER/2") == ["online", "offline"],
        "offline after the death",
        timeout=15,
    )
    assert first.bow.port


async def test_a_final_receipt_is_sent_once_as_message_receipt(
    gateways: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    config = {"redis": "redis://127.0.0.1:6379/0", "namespace": f"receipt-{uuid.uuid4().hex[:8]}"}
    first, second = await gateways(**config), await gateways(**config)
    one = await first.socketio("USER/1", FX)
    two = await second.socketio("USER/2", FX)
    async with first.http.post(
        first.url + PATH,
        json={"name": "news", "audience": TO_FX},
        headers={**AUTH, "Bow-Receipt": "1"},
    ) as response:
        assert response.status == 204
        message_id = response.headers["Bow-Message-Id"]
    await next_seen(one)
    await next_seen(two)
    await eventually(lambda: bool(of_type(receiver, "message.receipt")), "the receipt")
    await settle(receiver, 1.0)
    [receipt] = of_type(receiver, "message.receipt")
    assert receipt["id"] == message_id and receipt["state"] == "final" and receipt["complete"]
    assert (receipt["matched"], receipt["delivered"], receipt["acked"]) == (2, 2, 2)


async def test_bow_fallback_sends_the_ids_that_missed_it_as_message_undelivered(
    gateways: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    gateway = await gateways()
    here = await gateway.socketio("USER/1", FX)  # acknowledges
    stream = await gateway.sse("USER/3", FX)  # delivered is enough for it
    audience = [{"__id": "USER/1"}, {"__id": "USER/2"}, {"__id": "USER/3"}, {"__id": 4}]
    body = {"name": "news", "payload": {"n": 1}, "audience": audience}
    async with gateway.http.post(
        gateway.url + PATH, json=body, headers={**AUTH, "Bow-Fallback": "1"}
    ) as response:
        assert response.status == 204
        message_id = response.headers["Bow-Message-Id"]
    await next_seen(here)
    await next_seen(stream)
    await eventually(lambda: bool(of_type(receiver, "message.undelivered")), "the fallback")
    [undelivered] = of_type(receiver, "message.undelivered")
    assert undelivered == {
        "message": {"id": message_id, "name": "news", "payload": {"n": 1}},
        "listeners": ["USER/2", 4],
    }


async def test_no_message_undelivered_when_nobody_missed_it(
    gateways: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    gateway = await gateways()
    here = await gateway.socketio("USER/1", FX)
    async with gateway.http.post(
        gateway.url + PATH,
        json={"name": "news", "audience": [{"__id": "USER/1"}]},
        headers={**AUTH, "Bow-Fallback": "1"},
    ) as response:
        assert response.status == 204
    await next_seen(here)
    await eventually(lambda: bool(of_type(receiver, "message.receipt")), "the receipt")
    await settle(receiver, 0.5)
    assert of_type(receiver, "message.undelivered") == []


async def test_an_instance_forgets_the_ids_whose_sockets_it_no_longer_holds(
    gateways: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    """Regression: the set of ids an instance holds sockets of (for the sweep of a dead
    instance) kept every id it ever held, growing without bound."""
    import redis.asyncio as redis

    namespace = f"online-{uuid.uuid4().hex[:8]}"
    gateway = await gateways(redis="redis://127.0.0.1:6379/0", namespace=namespace)
    one = await gateway.socketio("USER/1", FX)
    await gateway.socketio("USER/2", FX)
    await eventually(lambda: len(of_type(receiver, "listener.online")) == 2, "both online")
    await one.close()
    await eventually(lambda: presence_of(receiver, "USER/1") == ["online", "offline"], "offline")
    backplane: Any = gateway.bow._backplane
    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        held = await client.smembers(f"{{{namespace}}}:online:by:{backplane.instance_id}")
    finally:
        await client.aclose()
    assert held == {b'"USER/2"'}


async def test_bow_publish_with_a_fallback_sends_message_undelivered(
    gateways: Callable[..., Awaitable[Mixed]], receiver: Receiver
) -> None:
    gateway = await gateways()
    message_id, _ = await gateway.bow.publish(
        {"name": "news", "audience": [{"__id": "USER/9"}]}, fallback=1
    )
    await eventually(lambda: bool(of_type(receiver, "message.undelivered")), "the fallback")
    [undelivered] = of_type(receiver, "message.undelivered")
    assert undelivered["message"]["id"] == message_id
    assert undelivered["listeners"] == ["USER/9"]
