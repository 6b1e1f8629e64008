"""Every protocol of one gateway at once (``clients.md`` sections 11-13): Socket.IO protocol 1
and 2, Server-Sent Events and Flywheel connections of one instance, with the same audience and
topic filters, receive the same messages once each, in push order; each connection's own
filters narrow what it receives, and a malformed filter is refused whatever the protocol.

A real gateway on a free port (the memory backplane), real clients: python-socketio, aiohttp's
client reading the SSE stream, and the Flywheel client written from the seed alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from bow_gateway import Bow

from .support import base_config, token
from .support.mixed_clients import (
    FX,
    TO_EQ,
    TO_FX,
    Client,
    Mixed,
    Seen,
    mixed_bow,
    next_seen,
    seen_until,
    without_positions,
)

FILTERS = ["quotes/+/EURUSD", "news/#"]


@pytest.fixture
async def gateway(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> AsyncIterator[Mixed]:
    # No __position nor id-only line in what is compared: the tests take seconds, not an hour.
    config = base_config(recovery={"position_interval": 3600})
    gateway = Mixed("A", await start_bow(mixed_bow(config)), http)
    yield gateway
    await gateway.close()


async def test_a_message_matching_on_every_protocol_reaches_each_connection_once_in_push_order(
    gateway: Mixed,
) -> None:
    socketio = await gateway.socketio("SIO", FX)
    assert await gateway.subscribe(socketio, {"add": FILTERS}) == {"filters": sorted(FILTERS)}
    stream = await gateway.sse("SSE", FX, FILTERS)
    flywheel = await gateway.flywheel("FLY", FX, subscribe=FILTERS)

    expected: list[Seen] = []
    for i in range(150):  # 50 that match, each between one of another name and one elsewhere
        n = i // 3
        name = "quotes/fx/EURUSD" if n % 2 else f"news/{n}"
        if i % 3 == 0:
            body = {"name": name, "payload": {"n": n}, "audience": TO_FX}
            expected.append((name, {"n": n}, await gateway.push(body)))
        elif i % 3 == 1:
            other = "quotes/fx/GBPUSD" if n % 2 else f"weather/{n}"
            await gateway.push({"name": other, "payload": {"n": n}, "audience": TO_FX})
        else:
            await gateway.push({"name": name, "payload": {"n": n}, "audience": TO_EQ})
    await gateway.push({"name": "news/end", "audience": TO_FX})

    assert len(expected) == 50
    assert await seen_until(socketio, "news/end") == expected
    assert await seen_until(stream, "news/end") == expected
    assert without_positions(await seen_until(flywheel, "news/end")) == without_positions(expected)
    # and nothing after the end but what comes next
    await gateway.push({"name": "news/after", "payload": 1, "audience": TO_FX})
    for client in (socketio, stream, flywheel):
        assert (await next_seen(client))[:2] == ("news/after", 1)


async def test_subscribe_narrows_a_protocol_2_socket_while_protocol_1_and_unsubscribed_get_all(
    gateway: Mixed,
) -> None:
    subscribed = await gateway.socketio("SUBSCRIBED", FX)
    assert await gateway.subscribe(subscribed, {"add": ["quotes/#"]}) == {"filters": ["quotes/#"]}
    unsubscribed = await gateway.socketio("UNSUBSCRIBED", FX)
    old = await gateway.socketio("OLD", FX, proto=None)
    names = ["news", "quotes/a", "weather/x", "quotes/b/c", "quotes"]
    positions = [
        await gateway.push({"name": name, "payload": i, "audience": TO_FX})
        for i, name in enumerate(names)
    ]
    await gateway.push({"name": "quotes/end", "audience": TO_FX})

    every = list(zip(names, range(len(names)), positions, strict=True))
    assert await seen_until(unsubscribed, "quotes/end") == every
    assert await seen_until(old, "quotes/end") == [(name, i, None) for name, i, _ in every]
    assert await seen_until(subscribed, "quotes/end") == [
        (name, i, position) for name, i, position in every if name.startswith("quotes")
    ]


async def test_an_sse_topic_narrows_that_stream_alone(gateway: Mixed) -> None:
    narrowed = await gateway.sse("NARROW", FX, ["news/+"])
    whole = await gateway.sse("WHOLE", FX)
    socketio = await gateway.socketio("SIO", FX)
    assert await gateway.subscribe(socketio, {"add": ["quotes/#"]}) == {"filters": ["quotes/#"]}
    names = ["news/a", "quotes/x", "news/a/b", "weather", "news/b"]
    sent = [
        (name, i, await gateway.push({"name": name, "payload": i, "audience": TO_FX}))
        for i, name in enumerate(names)
    ]
    await gateway.push({"name": "news/end", "audience": TO_FX})
    await gateway.push({"name": "quotes/end", "audience": TO_FX})

    assert await seen_until(whole, "news/end") == sent
    assert await seen_until(narrowed, "news/end") == [
        seen for seen in sent if seen[0] in ("news/a", "news/b")
    ]
    assert await seen_until(socketio, "quotes/end") == [
        seen for seen in sent if seen[0] == "quotes/x"
    ]


async def test_a_flywheel_connection_without_subscriptions_gets_nothing_while_others_get_all(
    gateway: Mixed,
) -> None:
    flywheel = await gateway.flywheel("FLY", FX)  # strict: no filter, nothing
    socketio = await gateway.socketio("SIO", FX)
    stream = await gateway.sse("SSE", FX)
    names = ["news", "quotes/a", "$remote/nobody/rx/x"]
    for name in names:
        await gateway.push({"name": name, "payload": 0, "audience": TO_FX})
    # Whenever the messages above are delivered, before this bind or after it, none is "end".
    assert (await flywheel.bind(subscribe=["end"]))["errors"] == []
    await gateway.push({"name": "end", "payload": 1, "audience": TO_FX})

    assert (await next_seen(flywheel))[:2] == ("end", 1)
    for client in (socketio, stream):  # $ names reach only their session
        assert [name for name, _, _ in await seen_until(client, "end")] == names[:2]


MALFORMED = ["a/#/b", "a+", "#a", "", "a/b#"]


async def test_malformed_socketio_filters_are_bad_request_4000(gateway: Mixed) -> None:
    socketio = await gateway.socketio("SIO", FX)
    for bad in MALFORMED:
        result = await gateway.subscribe(socketio, {"add": ["ok/#", bad]})
        error = result["error"]
        assert (error["code"], error["reason"]) == (4000, "bad_request"), (bad, result)
    assert await gateway.subscribe(socketio, {}) == {"filters": []}  # nothing was added
    await _still_served(gateway, socketio)


async def test_malformed_sse_topics_are_refused_with_400(gateway: Mixed) -> None:
    for bad in MALFORMED:
        response = await gateway.open_sse(token("SSE", FX), ["ok/#", bad])
        assert response.status == 400, (bad, await response.text())
        body = await response.json()
        assert (body["code"], body["reason"]) == (4000, "bad_request"), (bad, body)
        assert "topic" in body["text"]
    assert gateway.listeners() == 0  # none was held


async def test_malformed_flywheel_filters_are_general_errors_of_the_bind_response(
    gateway: Mixed,
) -> None:
    flywheel = await gateway.flywheel("FLY", FX)
    response = await flywheel.bind(subscribe=[*MALFORMED, "end"], messageId="m-1")
    assert response["messageId"] == "m-1"
    assert [error["type"] for error in response["errors"]] == ["General"] * len(MALFORMED)
    assert all("bad topic filter" in error["description"] for error in response["errors"])
    await _still_served(gateway, flywheel)  # and "end", the valid one, applied


async def _still_served(gateway: Mixed, client: Client) -> None:
    """``client`` is still connected and served: a message named ``end`` reaches it next."""
    await gateway.push({"name": "end", "payload": {"still": "here"}, "audience": TO_FX})
    assert (await next_seen(client))[:2] == ("end", {"still": "here"})
