"""The Socket.IO outbound, end to end: listeners and their criteria, matching, delivery."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from bow_gateway import Bow

from .support import (
    NO_DATA,
    Client,
    Gateway,
    plugin_bow,
    token,
)

# -- listeners, ids and criteria --------------------------------------------------------------


async def test_id_is_set_so_an_id_audience_reaches_that_listener_only(gateway: Gateway) -> None:
    one = await gateway.jwt_listener("USER/1", {"role": "admin"})
    two = await gateway.jwt_listener("USER/2", {"role": "admin"})
    await gateway.push({"name": "for-one", "audience": [{"__id": "USER/1"}]})
    assert await one.expect("for-one")
    await gateway.sentinel([{"__id": "USER/2"}], two)
    await gateway.sentinel([{"role": "admin"}], one, two)


async def test_id_combines_with_other_predicates(gateway: Gateway) -> None:
    one = await gateway.jwt_listener("USER/1", {"role": "admin"})
    await gateway.push({"name": "wrong-role", "audience": [{"__id": "USER/1", "role": "author"}]})
    await gateway.sentinel([{"__id": "USER/1", "role": "admin"}], one)


async def test_one_id_with_two_sockets_gets_each_message_once_on_each(gateway: Gateway) -> None:
    browser = await gateway.jwt_listener("USER/1", {"room": "a"})
    phone = await gateway.jwt_listener("USER/1", {"room": "a"})
    await gateway.push({"name": "hello", "audience": [{"room": "a"}, {"__id": "USER/1"}]})
    for socket in (browser, phone):
        assert await socket.expect("hello")
    # No second copy: the next event of each is the sentinel.
    await gateway.sentinel([{"__id": "USER/1"}], browser, phone)


async def test_new_criteria_for_an_id_apply_to_all_its_sockets(gateway: Gateway) -> None:
    browser = await gateway.jwt_listener("USER/1", {"room": "a"})
    phone = await gateway.jwt_listener("USER/1", {"room": "a"})
    await gateway.sentinel([{"room": "a"}], browser, phone)
    tablet = await gateway.jwt_listener("USER/1", {"room": "b"})
    await gateway.push({"name": "old-room", "audience": [{"room": "a"}]})
    await gateway.sentinel([{"room": "b"}], browser, phone, tablet)


async def test_closing_one_socket_of_an_id_keeps_its_other_sockets_served(
    gateway: Gateway,
) -> None:
    first = await gateway.jwt_listener("USER/1", {"room": "a"})
    second = await gateway.jwt_listener("USER/1", {"room": "a"})
    await first.close()
    await gateway.sentinel([{"room": "a"}], second)


# -- matching, end to end ---------------------------------------------------------------------


async def test_audience_is_an_or_of_queries(gateway: Gateway) -> None:
    admin = await gateway.jwt_listener("USER/1", {"role": "admin", "blogId": 1})
    author = await gateway.jwt_listener("USER/2", {"role": "author", "blogId": 42})
    other = await gateway.jwt_listener("USER/3", {"role": "author", "blogId": 418})
    audience = [{"role": "admin"}, {"role": "author", "blogId": 42}]
    await gateway.push({"name": "NEW_ARTICLE", "audience": audience})
    assert await admin.expect("NEW_ARTICLE")
    assert await author.expect("NEW_ARTICLE")
    await gateway.sentinel([{"__id": "USER/3"}], other)


async def test_query_is_an_and_of_predicates(gateway: Gateway) -> None:
    author = await gateway.jwt_listener("USER/1", {"role": "author", "blogId": 42})
    await gateway.push({"name": "half", "audience": [{"role": "author", "blogId": 7}]})
    await gateway.push({"name": "missing-key", "audience": [{"role": "author", "team": "x"}]})
    await gateway.sentinel([{"role": "author", "blogId": 42}], author)


async def test_list_criterion_matches_any_value_it_contains(gateway: Gateway) -> None:
    author = await gateway.jwt_listener("USER/1", {"blogId": [42, 418, "x", True]})
    for value in (42, 418, "x", True):
        await gateway.sentinel([{"blogId": value}], author)
    await gateway.push({"name": "not-in-list", "audience": [{"blogId": 7}, {"blogId": 1}]})
    await gateway.sentinel([{"__id": "USER/1"}], author)


async def test_true_does_not_match_one(gateway: Gateway) -> None:
    flagged = await gateway.jwt_listener("USER/1", {"flag": True, "n": 1})
    await gateway.push({"name": "one-for-true", "audience": [{"flag": 1}]})
    await gateway.push({"name": "true-for-one", "audience": [{"n": True}]})
    await gateway.push({"name": "false-for-zero", "audience": [{"flag": False}]})
    await gateway.sentinel([{"flag": True, "n": 1}], flagged)


async def test_string_42_does_not_match_number_42(gateway: Gateway) -> None:
    listener = await gateway.jwt_listener("USER/1", {"n": 42, "s": "42"})
    await gateway.push({"name": "string-for-number", "audience": [{"n": "42"}]})
    await gateway.push({"name": "number-for-string", "audience": [{"s": 42}]})
    await gateway.sentinel([{"n": 42, "s": "42"}], listener)


async def test_42_matches_42_point_0(gateway: Gateway) -> None:
    integer = await gateway.jwt_listener("USER/1", {"n": 42})
    floating = await gateway.jwt_listener("USER/2", {"n": 42.0})
    await gateway.sentinel([{"n": 42.0}], integer, floating)
    await gateway.sentinel([{"n": 42}], integer, floating)


async def test_event_carries_the_payload(serve: Callable[[Bow], Awaitable[Gateway]]) -> None:
    gateway = await serve(plugin_bow(lambda t: {"id": t}, lambda details: {}))
    client = await gateway.listener("USER/1")
    payload = {"title": "é", "nested": {"list": [1, 2.5, None, True]}, "n": 0}
    await gateway.push({"name": "with", "payload": payload, "audience": [{"__id": "USER/1"}]})
    assert await client.expect("with") == payload


async def test_absent_payload_gives_an_event_without_data(
    serve: Callable[[Bow], Awaitable[Gateway]],
) -> None:
    gateway = await serve(plugin_bow(lambda t: {"id": t}, lambda details: {}))
    client = await gateway.listener("USER/1")
    await gateway.push({"name": "bare", "audience": [{"__id": "USER/1"}]})
    assert await client.expect("bare") is NO_DATA


async def test_null_payload_gives_none(serve: Callable[[Bow], Awaitable[Gateway]]) -> None:
    gateway = await serve(plugin_bow(lambda t: {"id": t}, lambda details: {}))
    client = await gateway.listener("USER/1")
    await gateway.push({"name": "null", "payload": None, "audience": [{"__id": "USER/1"}]})
    assert await client.expect("null") is None


async def test_empty_audience_reaches_nobody(gateway: Gateway) -> None:
    client = await gateway.jwt_listener("USER/1")
    await gateway.push({"name": "nobody", "audience": []})
    await gateway.sentinel([{"__id": "USER/1"}], client)


# -- delivery ---------------------------------------------------------------------------------


async def test_messages_arrive_in_order_each_exactly_once(gateway: Gateway) -> None:
    client = await gateway.jwt_listener("USER/1")
    count = 200
    for seq in range(count):
        await gateway.push({"name": "tick", "seq": seq, "audience": [{"__id": "USER/1"}]})
    received = [(await client.expect("tick"))["seq"] for _ in range(count)]
    assert received == list(range(count))
    await gateway.sentinel([{"__id": "USER/1"}], client)


async def test_polling_transport_authenticates_and_receives(gateway: Gateway) -> None:
    client = await gateway.listener(token("USER/1", {"room": "a"}), transports=["polling"])
    assert client.client.transport() == "polling"
    await gateway.push({"name": "over-polling", "n": 1, "audience": [{"room": "a"}]})
    assert (await client.expect("over-polling"))["n"] == 1
    # End the session from the server: python-engineio's polling client that disconnects itself
    # waits for its pending long-poll, which the server answers only at the next ping (25 s).
    await gateway.push({"name": "__disconnect", "audience": [{"room": "a"}]})
    await client.wait_disconnected()


async def test_a_thousand_sockets_all_receive_a_broadcast(gateway: Gateway) -> None:
    count = 1_000
    gate = asyncio.Semaphore(50)
    clients = [Client(gateway.url) for _ in range(count)]

    async def join(position: int, client: Client) -> None:
        async with gate:
            await client.connect("v1.3")
            await client.authenticate_with_ack(token(f"USER/{position}", {"room": "all"}), 30)

    try:
        await asyncio.wait_for(asyncio.gather(*(join(i, c) for i, c in enumerate(clients))), 45)
        await gateway.push({"name": "broadcast", "audience": [{"room": "all"}]})
        await asyncio.wait_for(
            asyncio.gather(*(client.expect("broadcast", 20) for client in clients)), 25
        )
    finally:

        async def leave(client: Client) -> None:
            async with gate:
                await client.close()

        await asyncio.gather(*(leave(client) for client in clients))


async def test_disconnect_message_disconnects_every_matching_socket_only(gateway: Gateway) -> None:
    admin_browser = await gateway.jwt_listener("USER/1", {"role": "admin"})
    admin_phone = await gateway.jwt_listener("USER/1", {"role": "admin"})
    other_admin = await gateway.jwt_listener("USER/2", {"role": "admin", "blogId": 7})
    author = await gateway.jwt_listener("USER/3", {"role": "author", "blogId": 7})
    anonymous = await gateway.connect()
    await gateway.push(
        {"name": "__disconnect", "audience": [{"__id": "USER/1"}, {"role": "admin", "blogId": 7}]}
    )
    for gone in (admin_browser, admin_phone, other_admin):
        await gone.wait_disconnected()
        assert gone.log == ["disconnect"], gone.log  # no __disconnect event, no alert
    await gateway.sentinel([{"blogId": 7}], author)
    assert author.log == ["sentinel-1"]
    assert anonymous.client.connected and anonymous.log == []


async def test_disconnected_listener_can_reconnect_and_receive(gateway: Gateway) -> None:
    first = await gateway.jwt_listener("USER/1", {"role": "admin"})
    await gateway.push({"name": "__disconnect", "audience": [{"__id": "USER/1"}]})
    await first.wait_disconnected()
    again = await gateway.jwt_listener("USER/1", {"role": "admin"})
    await gateway.sentinel([{"role": "admin"}], again)
