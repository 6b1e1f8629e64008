"""Contract section 15: an inbound function that returns a list of messages (a batch), against a
real gateway on a free port (the memory backplane), over real HTTP, to real python-socketio
listeners (protocol 2, so that each event carries its position)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from bow_gateway.inbounds.passthrough import (
    create_message_from_envelope,
    create_message_from_request_body,
)
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound

from bow_gateway import Bow

from .support import AUTH, PASSWORD, PATH, REALM, SECRET, USER, base_config, read_metric
from .support.protocol2 import Listener

AUDIENCE = [{"role": "admin"}]


def as_is(body: Any) -> Any:
    """The inbound of these tests: the body is the message, or the list of messages."""
    return body


def batch_bow(**config: Any) -> Bow:
    return (
        Bow(base_config(**config))
        .middleware(version="v1.1", create_criteria_from_listener_details=criteria_from_claim())
        .inbound(path=PATH, create_message_from_request_body=as_is, middleware_version="v1.1")
        .outbound(
            version="v1.3",
            create_listener_details_from_token=JwtOutbound(secret=SECRET),
            middleware_version="v1.1",
        )
    )


Post = Callable[[Any], Awaitable[tuple[int, str, str | None]]]


@pytest.fixture
async def gateway(start_bow: Callable[[Bow], Awaitable[Bow]]) -> Bow:
    inbound = {"realm": REALM, "username": USER, "password": PASSWORD, "max_batch": 5}
    return await start_bow(batch_bow(inbound=inbound))


@pytest.fixture
async def post(gateway: Bow, http: aiohttp.ClientSession) -> Post:
    """``status, text, Bow-Position = await post(body)``."""

    async def send(body: Any) -> tuple[int, str, str | None]:
        url = f"http://127.0.0.1:{gateway.port}{PATH}"
        async with http.post(url, json=body, headers=AUTH) as response:
            return response.status, await response.text(), response.headers.get("Bow-Position")

    return send


@pytest.fixture
async def listener(gateway: Bow) -> AsyncIterator[Listener]:
    made = await Listener().connect(f"http://127.0.0.1:{gateway.port}")
    yield made
    await made.client.disconnect()


def message(name: str, n: int) -> dict[str, Any]:
    return {"name": name, "payload": {"n": n}, "audience": AUDIENCE}


async def sentinel(post: Post, listener: Listener) -> None:
    """Push one more message: the listener's next event must be it (nothing came before)."""
    status, text, _ = await post(message("sentinel", 0))
    assert status == 204, text
    assert (await listener.next())[0] == "sentinel"


async def test_a_batch_is_delivered_in_order_and_answered_with_the_last_position(
    post: Post, listener: Listener
) -> None:
    status, text, position = await post([message("a", 1), message("b", 2), message("c", 3)])
    assert status == 204, text
    received = [await listener.next() for _ in range(3)]
    assert [(name, args[0]) for name, args in received] == [
        ("a", {"n": 1}),
        ("b", {"n": 2}),
        ("c", {"n": 3}),
    ]
    positions = [args[1]["position"] for _, args in received]
    assert len(set(positions)) == 3
    assert position == positions[-1]


async def test_a_batch_with_a_bad_second_message_is_refused_naming_index_1_and_none_delivered(
    post: Post, listener: Listener
) -> None:
    bad = {"name": "b", "audience": [{}]}
    status, text, position = await post([message("a", 1), bad, message("c", 3)])
    assert status == 422
    assert text.startswith("422: invalid message: 1.audience.0: "), text
    assert position is None
    await sentinel(post, listener)


async def test_a_batch_is_refused_at_its_first_bad_message(post: Post) -> None:
    status, text, _ = await post([message("a", 1), message("b", 2), {"name": ""}, "nonsense"])
    assert status == 422
    assert "2.name: " in text and "3:" not in text, text


async def test_a_batch_over_inbound_max_batch_is_413_and_none_delivered(
    post: Post, listener: Listener
) -> None:
    status, text, _ = await post([message("m", n) for n in range(6)])  # max_batch is 5 here
    assert status == 413
    assert "6 messages" in text and "inbound.max_batch (5)" in text, text
    status, text, _ = await post([message("m", n) for n in range(5)])
    assert status == 204, text
    assert [(await listener.next())[0] for _ in range(5)] == ["m"] * 5
    await sentinel(post, listener)


async def test_an_event_over_max_event_bytes_in_a_batch_is_413_naming_it_and_none_delivered(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(batch_bow(outbound={"timeout": 5, "max_event_bytes": 100}))
    listener = await Listener().connect(f"http://127.0.0.1:{bow.port}")
    url = f"http://127.0.0.1:{bow.port}{PATH}"
    big = {"name": "big", "payload": "x" * 200, "audience": AUDIENCE}
    try:
        async with http.post(url, json=[message("a", 1), big], headers=AUTH) as response:
            assert response.status == 413
            assert (await response.text()).startswith("413: 1: the event"), await response.text()
        async with http.post(url, json=message("after", 1), headers=AUTH) as response:
            assert response.status == 204
        assert (await listener.next())[0] == "after"
    finally:
        await listener.client.disconnect()


async def test_an_empty_batch_is_204_without_a_position(post: Post, listener: Listener) -> None:
    status, text, position = await post([])
    assert (status, text, position) == (204, "", None)
    await sentinel(post, listener)


async def test_each_message_of_a_batch_is_counted_as_accepted(
    gateway: Bow, post: Post, http: aiohttp.ClientSession
) -> None:
    sample = f'bow_messages_accepted_total{{inbound="{PATH}"}}'
    url = f"http://127.0.0.1:{gateway.port}"
    before = await read_metric(http, url, sample)
    status, _, _ = await post([message("m", n) for n in range(3)])
    assert status == 204
    assert await read_metric(http, url, sample) == before + 3


def test_the_bundled_json_inbounds_take_a_list_of_bodies_as_a_batch() -> None:
    bodies = [message("a", 1), {"name": "b", "audience": AUDIENCE}]
    assert create_message_from_request_body(bodies) == [
        {"name": "a", "payload": message("a", 1), "audience": AUDIENCE},
        {"name": "b", "payload": {"name": "b", "audience": AUDIENCE}, "audience": AUDIENCE},
    ]
    assert create_message_from_envelope(bodies) == bodies


@pytest.mark.parametrize(
    "inbound", [create_message_from_request_body, create_message_from_envelope]
)
def test_a_bad_item_of_a_list_is_refused_naming_its_index(inbound: Callable[[Any], Any]) -> None:
    with pytest.raises(
        ValueError, match=r"^1: an item of the list must be a JSON object, not int$"
    ):
        inbound([message("a", 1), 7])
