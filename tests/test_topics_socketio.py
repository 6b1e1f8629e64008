"""Topics on Socket.IO protocol 2 (clients.md section 11), end to end: ``subscribe`` narrows what a
socket receives, live and replayed; protocol 1 ignores it; the inbound refuses ``$`` names.

Real gateways on free ports (the memory backplane) and real python-socketio clients.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow
from bow_gateway.core.topic_index import TopicIndex

from .support import AUTH, PATH, WAIT, Gateway, base_config, token, until
from .support.protocol2 import BLOG_42, P2, P2Gateway, p2_bow

READER = {"role": "reader", "blogId": 42}

Serve = Callable[..., Awaitable[P2Gateway]]


@pytest.fixture
async def serve(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> AsyncIterator[Serve]:
    """``gateway = await serve(**config)``: a protocol-2 gateway with its watcher connected."""
    gateways: list[P2Gateway] = []

    async def start(**config: Any) -> P2Gateway:
        gateway = P2Gateway(Gateway(await start_bow(p2_bow(base_config(**config))), http))
        gateways.append(gateway)
        await gateway.watch()
        return gateway

    yield start
    for gateway in gateways:
        await gateway.close()


async def subscribe(client: P2, request: Any) -> Any:
    """``subscribe`` with an acknowledgement: the ack's result."""
    return await client.client.call("subscribe", request, timeout=WAIT)


def bad_request(result: Any, says: str) -> None:
    assert set(result) == {"error"}, result
    error = result["error"]
    assert (error["code"], error["reason"]) == (4000, "bad_request"), error
    assert says in error["text"], error["text"]


def topics_of(gateway: P2Gateway) -> TopicIndex[Any]:
    """The topic index of the gateway's only middleware version."""
    outbound = gateway.bow._outbound
    assert outbound is not None
    (topics,) = outbound.topics.values()
    return topics


async def reader(gateway: P2Gateway, listener_id: str = "USER/1") -> P2:
    client, _ = await gateway.listener(token(listener_id, READER))
    return client


async def test_a_socket_with_filters_receives_only_the_names_they_match(serve: Serve) -> None:
    gateway = await serve()
    quotes, everything = await reader(gateway, "USER/1"), await reader(gateway, "USER/2")
    assert await subscribe(quotes, {"add": ["quotes/#", "news/+/today"]}) == {
        "filters": ["news/+/today", "quotes/#"]
    }
    sent = []
    for name in ["news/world", "quotes/forex/EURUSD", "weather", "news/world/today", "quotes"]:
        sent.append((name, await gateway.push({"name": name, "audience": BLOG_42})))
    for name, position in sent:
        assert await everything.expect(name) == (None, {"position": position})
    for name, position in sent:
        if name in ("quotes/forex/EURUSD", "news/world/today", "quotes"):
            assert await quotes.expect(name) == (None, {"position": position})
    await gateway.sentinel([{"__id": "USER/2"}], everything)
    assert quotes.events.empty(), quotes.log


async def test_filters_never_widen_the_audience(serve: Serve) -> None:
    gateway = await serve()
    client = await reader(gateway)
    await subscribe(client, {"add": ["#"]})
    await gateway.push({"name": "quotes/x", "audience": [{"blogId": 7}]})
    position = await gateway.push({"name": "quotes/y", "audience": BLOG_42})
    assert await client.expect("quotes/y") == (None, {"position": position})


async def test_the_ack_holds_the_whole_set_sorted_and_adding_again_changes_nothing(
    serve: Serve,
) -> None:
    gateway = await serve()
    client = await reader(gateway)
    assert await subscribe(client, {"add": ["b", "a/#"]}) == {"filters": ["a/#", "b"]}
    assert await subscribe(client, {"add": ["b", "b", "c"]}) == {"filters": ["a/#", "b", "c"]}
    assert await subscribe(client, {"remove": ["b"]}) == {"filters": ["a/#", "c"]}
    assert await subscribe(client, {}) == {"filters": ["a/#", "c"]}  # asks for the set
    assert await subscribe(client, {"remove": ["a/#"], "add": ["d"]}) == {"filters": ["c", "d"]}


async def test_a_socket_that_removes_its_last_filter_receives_every_name_again(
    serve: Serve,
) -> None:
    gateway = await serve()
    client = await reader(gateway)
    await subscribe(client, {"add": ["quotes/#"]})
    await gateway.push({"name": "news", "audience": BLOG_42})
    await gateway.settle()  # delivered, and not to the client
    assert await subscribe(client, {"remove": ["quotes/#"]}) == {"filters": []}
    assert not topics_of(gateway).holders
    position = await gateway.push({"name": "news", "audience": BLOG_42})
    assert await client.expect("news") == (None, {"position": position})


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        ({"add": ["ok/#", "a/#/b"]}, "add.1: 'a/#/b': # must be the last level"),
        ({"add": ["a+"]}, "+ must be a whole level"),
        ({"add": ["#a"]}, "# must be a whole level"),
        ({"add": [""]}, "must not be empty"),
        ({"add": [7]}, "a filter is a string"),
        ({"add": ["$SYS/#"]}, "names starting with $ are the gateway's own"),
        ({"add": ["$remote/x/rx/#"]}, "names starting with $ are the gateway's own"),
        ({"add": ["ok"], "remove": ["b/#/c"]}, "remove.0"),
        ({"add": "ok/#"}, "add must be a list"),
        ({"add": ["ok"], "remove": ["ok"]}, "'ok' is both added and removed"),
        ({"add": ["ok"], "subscribe": ["x"]}, "unknown key 'subscribe'"),
        (["ok"], "subscribe takes one argument"),
        ("ok", "subscribe takes one argument"),
    ],
)
async def test_a_bad_subscribe_is_bad_request_and_changes_nothing(
    serve: Serve, request_: Any, says: str
) -> None:
    gateway = await serve()
    client = await reader(gateway)
    assert await subscribe(client, {"add": ["held"]}) == {"filters": ["held"]}
    bad_request(await subscribe(client, request_), says)
    assert await subscribe(client, {}) == {"filters": ["held"]}
    assert not client.alerts and client.client.connected  # not fatal: the socket stays
    position = await gateway.push({"name": "held", "audience": BLOG_42})
    assert await client.expect("held") == (None, {"position": position})


async def test_subscribe_with_two_arguments_is_bad_request(serve: Serve) -> None:
    gateway = await serve()
    client = await reader(gateway)
    bad_request(
        await client.client.call("subscribe", ({"add": ["a"]}, {}), timeout=WAIT),
        "subscribe takes one argument",
    )


async def test_remove_takes_exactly_a_filter_added_before(serve: Serve) -> None:
    gateway = await serve()
    client = await reader(gateway)
    await subscribe(client, {"add": ["sport/#"]})
    for other in ["sport/+", "sport", "#", "sport/tennis/#", "never-added"]:
        assert await subscribe(client, {"remove": [other]}) == {"filters": ["sport/#"]}
    position = await gateway.push({"name": "sport/tennis", "audience": BLOG_42})
    assert await client.expect("sport/tennis") == (None, {"position": position})


async def test_at_most_max_filters_per_socket(serve: Serve) -> None:
    gateway = await serve(outbound={"timeout": 5, "max_filters": 3})
    client = await reader(gateway)
    assert await subscribe(client, {"add": ["a", "b", "c"]}) == {"filters": ["a", "b", "c"]}
    bad_request(await subscribe(client, {"add": ["d"]}), "at most 3 filters")
    bad_request(await subscribe(client, {"add": ["d", "e"], "remove": ["a"]}), "make 4")
    assert await subscribe(client, {"add": ["a", "b"]}) == {"filters": ["a", "b", "c"]}
    assert await subscribe(client, {"add": ["d"], "remove": ["a"]}) == {"filters": ["b", "c", "d"]}
    other = await reader(gateway, "USER/2")  # per socket
    assert await subscribe(other, {"add": ["x", "y", "z"]}) == {"filters": ["x", "y", "z"]}


async def test_max_filters_defaults_to_100(serve: Serve) -> None:
    gateway = await serve()
    client = await reader(gateway)
    filters = [f"f/{i}" for i in range(100)]
    assert await subscribe(client, {"add": filters}) == {"filters": sorted(filters)}
    bad_request(await subscribe(client, {"add": ["one/more"]}), "at most 100 filters")


async def test_subscribing_before_authenticating_keeps_the_filters(serve: Serve) -> None:
    gateway = await serve()
    client = await gateway.connect()
    assert await subscribe(client, {"add": ["quotes/#"]}) == {"filters": ["quotes/#"]}
    await client.authenticate(token("USER/1", READER))
    await gateway.push({"name": "news", "audience": BLOG_42})
    position = await gateway.push({"name": "quotes/x", "audience": BLOG_42})
    assert await client.expect("quotes/x") == (None, {"position": position})


async def test_filters_outlive_a_re_authentication(serve: Serve) -> None:
    gateway = await serve()
    client = await reader(gateway)
    await subscribe(client, {"add": ["quotes/#"]})
    await client.authenticate(token("USER/1", READER))
    await gateway.push({"name": "news", "audience": BLOG_42})
    position = await gateway.push({"name": "quotes/x", "audience": BLOG_42})
    assert await client.expect("quotes/x") == (None, {"position": position})


async def test_subscribe_without_an_ack_is_applied(serve: Serve) -> None:
    gateway = await serve()
    client = await reader(gateway)
    await client.client.emit("subscribe", {"add": ["quotes/#"]})
    assert await subscribe(client, {}) == {"filters": ["quotes/#"]}


async def test_a_recovery_replays_only_what_the_filters_match(serve: Serve) -> None:
    gateway = await serve()
    first = await reader(gateway)
    since = await gateway.push({"name": "quotes/a", "audience": BLOG_42})
    await first.expect("quotes/a")
    await first.close()
    missed = []
    for name in ["news/1", "quotes/b", "weather", "quotes/c/d"]:
        missed.append((name, await gateway.push({"name": name, "payload": 1, "audience": BLOG_42})))
    await gateway.settle()
    client = await gateway.connect()
    # the natural reconnection: filters first, then authenticate with since
    await subscribe(client, {"add": ["quotes/#"]})
    result = await client.authenticate(token("USER/1", READER), {"since": since})
    assert result["recovered"] is True, result
    for name, position in missed:
        if name.startswith("quotes/"):
            assert await client.expect(name) == (1, {"position": position, "replayed": True})
    position = await gateway.push({"name": "quotes/live", "audience": BLOG_42})
    assert await client.expect("quotes/live") == (None, {"position": position})


async def test_max_replay_counts_only_what_the_filters_match(serve: Serve) -> None:
    gateway = await serve(recovery={"max_replay": 2})
    first = await reader(gateway)
    since = await gateway.push({"name": "x", "audience": BLOG_42})
    await first.expect("x")
    await first.close()
    for name in ["news/1", "news/2", "news/3", "quotes/1", "quotes/2"]:
        await gateway.push({"name": name, "audience": BLOG_42})
    await gateway.settle()
    client = await gateway.connect()
    await subscribe(client, {"add": ["quotes/+"]})
    result = await client.authenticate(token("USER/1", READER), {"since": since})
    assert (result["recovered"], result["reason"]) == (True, None), result
    assert [(await client.next())[0] for _ in range(2)] == ["quotes/1", "quotes/2"]


async def test_a_disconnect_message_reaches_a_socket_whatever_its_filters(serve: Serve) -> None:
    gateway = await serve()
    client = await reader(gateway)
    await subscribe(client, {"add": ["quotes/#"]})
    await gateway.push({"name": "__disconnect", "audience": BLOG_42})
    await client.wait_disconnected()
    assert client.alerts[0][1]["code"] == 4006


async def test_a_socket_gone_leaves_no_filter_behind(serve: Serve) -> None:
    gateway = await serve()
    topics = topics_of(gateway)
    client = await reader(gateway)
    await subscribe(client, {"add": ["quotes/#", "news/+"]})
    assert len(topics.holders) == 1
    await client.close()
    await until(lambda: not topics.holders, "the filters to be forgotten")
    assert topics._root.children == {}


async def test_protocol_1_ignores_subscribe(serve: Serve) -> None:
    gateway = await serve()
    client = await gateway.connect(proto=None)
    await client.authenticate(token("USER/1", READER))
    acks: list[Any] = []
    await client.client.emit("subscribe", {"add": ["quotes/#"]}, callback=acks.append)
    await asyncio.sleep(0.2)  # no ack comes to wait for
    assert acks == [] and client.client.connected
    assert not topics_of(gateway).holders
    await gateway.push({"name": "news", "payload": 1, "audience": BLOG_42})
    assert await client.expect("news") == (1,)  # protocol 1: the payload alone


async def test_protocol_1_and_2_sockets_share_a_gateway(serve: Serve) -> None:
    gateway = await serve()
    old = await gateway.connect(proto=None)
    await old.authenticate(token("USER/1", READER))
    new = await reader(gateway, "USER/2")
    await subscribe(new, {"add": ["quotes/#"]})
    await gateway.push({"name": "news", "audience": BLOG_42})
    position = await gateway.push({"name": "quotes/x", "audience": BLOG_42})
    assert await old.expect("news") == ()
    assert await old.expect("quotes/x") == ()
    assert await new.expect("quotes/x") == (None, {"position": position})


@pytest.mark.parametrize("name", ["$x", "$SYS/load", "$remote/abc", "$remote/abc/tx/x"])
async def test_the_inbound_refuses_a_dollar_name(serve: Serve, name: str) -> None:
    gateway = await serve()
    body = {"name": name, "audience": BLOG_42}
    async with gateway.http.post(gateway.url + PATH, json=body, headers=AUTH) as response:
        assert response.status == 422
        assert "names starting with $ are the gateway's own topics" in await response.text()


async def test_the_inbound_takes_a_remote_name(serve: Serve) -> None:
    gateway = await serve()
    await gateway.push({"name": "$remote/session-1/rx/ping", "audience": BLOG_42})
