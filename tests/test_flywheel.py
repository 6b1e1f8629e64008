"""The Flywheel WebSocket outbound (``clients.md`` section 12), end to end: a real gateway on a
free port and a client written from the seed's protocol section alone
(:mod:`.support.flywheel_client`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import pytest
from bow_gateway.inbounds.passthrough import create_message_from_envelope
from bow_gateway.middlewares.claims import criteria_from_claim

from bow_gateway import Bow
from bow_gateway.outbound import liveness

from .support import PATH, Gateway, base_config, metric, token
from .support.flywheel import QUOTES, bearer, flywheel_bow
from .support.flywheel_client import FlywheelClient

Serve = Callable[[Bow], Awaitable[Gateway]]
NO_ID = "00000000-0000-0000-0000-000000000000"


@pytest.fixture
async def gateway(serve: Serve) -> Gateway:
    return await serve(flywheel_bow(anonymous={"public": True}))


@pytest.fixture
async def open_client(gateway: Gateway, http: aiohttp.ClientSession) -> Any:
    clients: list[FlywheelClient] = []

    async def open_(**kwargs: Any) -> FlywheelClient:
        client = await FlywheelClient.open(http, gateway.url, **kwargs)
        clients.append(client)
        return client

    yield open_
    for client in clients:
        await client.close()


Open = Callable[..., Awaitable[FlywheelClient]]


async def trader(open_client: Open, name: str = "T1", **bind: Any) -> FlywheelClient:
    client = await open_client()
    response = await client.bind(auth=bearer(name, {"desk": "fx"}), **bind)
    assert response["errors"] == [], response
    return client


# -- bind ---------------------------------------------------------------------------------------


async def test_a_bind_is_answered_with_its_message_id(open_client: Open) -> None:
    client = await open_client()
    response = await client.bind(
        sessionId="s-1",
        auth=bearer("T1", {"desk": "fx"}),
        subscribe=["quotes/#"],
        metadata={"osType": "Android"},
        messageId="123e4567-e89b-12d3-a456-426655440000",
    )
    assert response == {
        "type": "BindResponse",
        "errors": [],
        "messageId": "123e4567-e89b-12d3-a456-426655440000",
    }


async def test_a_bind_without_message_id_is_answered_with_the_zero_uuid(open_client: Open) -> None:
    client = await open_client()
    assert (await client.bind())["messageId"] == NO_ID


async def test_only_subscribed_topics_whose_audience_matches_arrive(
    gateway: Gateway, open_client: Open
) -> None:
    client = await trader(open_client, subscribe=["quotes/#"])
    await gateway.push({"name": "news/fx", "payload": "no", "audience": QUOTES})
    await gateway.push({"name": "quotes/AAPL", "payload": "no", "audience": [{"desk": "eq"}]})
    await gateway.push({"name": "quotes/AAPL", "payload": {"bid": 148.82}, "audience": QUOTES})
    await gateway.push({"name": "quotes/fx/EURUSD", "payload": "1.07", "audience": QUOTES})
    assert await client.receive() == ("quotes/AAPL", '{"bid":148.82}')
    assert await client.receive() == ("quotes/fx/EURUSD", "1.07")


async def test_a_connection_without_subscriptions_receives_nothing(
    gateway: Gateway, open_client: Open
) -> None:
    client = await trader(open_client)
    await gateway.push({"name": "quotes/AAPL", "payload": "1", "audience": QUOTES})
    assert await client.nothing_within(0.3)


async def test_unsubscribe_takes_exactly_a_filter_held(gateway: Gateway, open_client: Open) -> None:
    client = await trader(open_client, subscribe=["quotes/#", "quotes/AAPL"])
    assert (await client.bind(unsubscribe=["quotes/#"]))["errors"] == []
    await gateway.push({"name": "quotes/DELL", "payload": "1", "audience": QUOTES})
    await gateway.push({"name": "quotes/AAPL", "payload": "2", "audience": QUOTES})
    assert await client.receive() == ("quotes/AAPL", "2")


async def test_remote_subscriptions_get_topic_access(open_client: Open) -> None:
    client = await open_client()
    response = await client.bind(
        sessionId="s-1",
        auth=bearer("T1", {"desk": "fx"}),
        subscribe=["$remote/s-1/rx/errors", "quotes/#", "$SYS/#"],
    )
    assert [(e["type"], e["topic"]) for e in response["errors"]] == [
        ("TopicAccess", "$remote/s-1/rx/errors"),
        ("TopicAccess", "$SYS/#"),
    ]


async def test_malformed_filters_are_refused_and_the_rest_applied(
    gateway: Gateway, open_client: Open
) -> None:
    client = await open_client()
    response = await client.bind(
        auth=bearer("T1", {"desk": "fx"}), subscribe=["a/#/b", "a+", "", "quotes/+"]
    )
    assert [e["type"] for e in response["errors"]] == ["General"] * 3
    await gateway.push({"name": "quotes/AAPL", "payload": "1", "audience": QUOTES})
    assert await client.receive() == ("quotes/AAPL", "1")


async def test_without_auth_or_anonymous_criteria_every_filter_is_refused(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    gateway = await serve(flywheel_bow())
    client = await FlywheelClient.open(http, gateway.url)
    response = await client.bind(subscribe=["quotes/#"])
    assert response["errors"] == [
        {"type": "TopicAccess", "description": "bind with auth first", "topic": "quotes/#"}
    ]
    await client.close()


async def test_an_anonymous_connection_receives_what_its_criteria_match(
    gateway: Gateway, open_client: Open
) -> None:
    client = await open_client()
    assert (await client.bind(subscribe=["news/#"]))["errors"] == []
    await gateway.push({"name": "news/a", "payload": "private", "audience": QUOTES})
    await gateway.push({"name": "news/b", "payload": "public", "audience": [{"public": True}]})
    assert await client.receive() == ("news/b", "public")


async def test_anonymous_binds_past_max_anonymous_are_closed_with_4009(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    # Regression (issue 28): a bind without auth indexed the connection around admission, so
    # outbound.max_anonymous, which bounds anonymous Socket.IO and SSE connections, never
    # counted Flywheel's.
    config = base_config(outbound={"timeout": 5, "max_anonymous": 2})
    gateway = await serve(flywheel_bow(config, anonymous={"public": True}))
    held = [await FlywheelClient.open(http, gateway.url) for _ in range(2)]
    for client in held:
        assert (await client.bind(subscribe=["news/#"]))["errors"] == []
    third = await FlywheelClient.open(http, gateway.url)
    try:
        response = await third.bind(subscribe=["news/#"])
        assert response["errors"][0]["type"] == "General"
        assert (await third.closed())[0] == 4009
        await gateway.push({"name": "news/b", "payload": "public", "audience": [{"public": True}]})
        for client in held:  # the older ones stay
            assert await client.receive() == ("news/b", "public")
    finally:
        for client in (*held, third):
            await client.close()


async def test_a_bind_that_is_not_json_is_a_general_error(open_client: Open) -> None:
    client = await open_client()
    await client.websocket.send_str("B {not json")
    kind, rest = await client._next_frame()
    response = json.loads(rest)
    assert kind == "B" and response["messageId"] == NO_ID
    assert [e["type"] for e in response["errors"]] == ["General"]


async def test_an_unknown_auth_type_is_a_general_error(open_client: Open) -> None:
    client = await open_client()
    response = await client.bind(auth={"type": "Kerberos", "ticket": "x"})
    assert response["errors"] == [
        {"type": "General", "description": "unknown auth type 'Kerberos': Bearer or Basic"}
    ]


async def test_basic_auth_hands_the_whole_object_to_the_outbound(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    seen: list[Any] = []

    def details(credentials: Any) -> dict[str, Any]:
        seen.append(credentials)
        if credentials != {"type": "Basic", "username": "ann", "password": "pw"}:
            raise PermissionError("wrong password")
        return {"id": "ann", "criteria": {"desk": "fx"}}

    bow = (
        Bow(base_config())
        .middleware(version="v1", create_criteria_from_listener_details=criteria_from_claim())
        .inbound(
            path=PATH,
            create_message_from_request_body=create_message_from_envelope,
            middleware_version="v1",
        )
        .outbound(version="v1", create_listener_details_from_token=details, middleware_version="v1")
    )
    gateway = await serve(bow)
    client = await FlywheelClient.open(http, gateway.url)
    basic = {"type": "Basic", "username": "ann", "password": "pw"}
    assert (await client.bind(auth=basic, subscribe=["quotes/#"]))["errors"] == []
    await gateway.push({"name": "quotes/x", "payload": "1", "audience": QUOTES})
    assert await client.receive() == ("quotes/x", "1")
    assert seen == [basic]
    await client.close()


# -- re-binding -----------------------------------------------------------------------------------


async def test_a_new_bind_with_a_new_token_is_a_refresh(
    gateway: Gateway, open_client: Open
) -> None:
    client = await trader(open_client, subscribe=["quotes/#"])
    response = await client.bind(auth=bearer("T1", {"desk": "eq"}))
    assert response["errors"] == []
    await gateway.push({"name": "quotes/fx", "payload": "old", "audience": QUOTES})
    await gateway.push({"name": "quotes/eq", "payload": "new", "audience": [{"desk": "eq"}]})
    assert await client.receive() == ("quotes/eq", "new")
    assert await metric(gateway, "bow_refreshes_total") == 1


async def test_an_anonymous_connection_upgrades_to_an_id(
    gateway: Gateway, open_client: Open
) -> None:
    client = await open_client()
    await client.bind(subscribe=["quotes/#"])
    assert (await client.bind(auth=bearer("T1", {"desk": "fx"})))["errors"] == []
    await gateway.push({"name": "quotes/x", "payload": "1", "audience": [{"__id": "T1"}]})
    assert await client.receive() == ("quotes/x", "1")


async def test_a_bind_as_another_id_closes_with_4004(open_client: Open) -> None:
    client = await trader(open_client)
    response = await client.bind(auth=bearer("T2", {"desk": "fx"}))
    assert response["errors"][0]["type"] == "General"
    assert (await client.closed())[0] == 4004


async def test_a_refused_token_is_answered_then_closed_with_4002(open_client: Open) -> None:
    client = await open_client()
    response = await client.bind(auth={"type": "Bearer", "token": "not-a-jwt"})
    assert response["errors"][0]["type"] == "General"
    assert (await client.closed())[0] == 4002


async def test_a_connection_not_bound_in_time_is_closed_with_4001(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    gateway = await serve(flywheel_bow(base_config(outbound={"timeout": 0.3})))
    client = await FlywheelClient.open(http, gateway.url)
    started = time.monotonic()
    code, reason = await client.closed()
    assert code == 4001 and "bound" in reason
    assert time.monotonic() - started < 2.0


async def test_a_bind_without_auth_does_not_stop_the_clock(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    gateway = await serve(flywheel_bow(base_config(outbound={"timeout": 0.3})))
    client = await FlywheelClient.open(http, gateway.url)
    await client.bind(sessionId="s-1")
    assert (await client.closed())[0] == 4001


# -- publish ------------------------------------------------------------------------------------


async def test_a_publish_reaches_every_matching_subscriber(
    gateway: Gateway, open_client: Open
) -> None:
    publisher = await trader(open_client, "T1", subscribe=["quotes/#"])
    other = await trader(open_client, "T2", subscribe=["quotes/AAPL"])
    socketio = await gateway.listener(token("T3", {"desk": "fx"}), "v1")
    await publisher.publish("quotes/AAPL", '{"bid":148.82,"ask":148.84}')
    assert await publisher.receive() == ("quotes/AAPL", '{"bid":148.82,"ask":148.84}')
    assert await other.receive() == ("quotes/AAPL", '{"bid":148.82,"ask":148.84}')
    assert await socketio.expect("quotes/AAPL") == '{"bid":148.82,"ask":148.84}'


async def test_a_refused_publish_is_told_on_the_session_s_errors_topic(
    open_client: Open,
) -> None:
    client = await trader(open_client, sessionId="s-9")
    await client.publish("news/x", "hello")
    topic, body = await client.receive()
    assert topic == "$remote/s-9/rx/errors"
    [error] = json.loads(body)
    assert error["type"] == "TopicAccess" and error["topic"] == "news/x"
    assert "no publishing on news/x" in error["description"]


async def test_without_a_session_id_errors_go_to_anon(gateway: Gateway, open_client: Open) -> None:
    client = await open_client()
    await client.bind(subscribe=["quotes/#"])  # anonymous: the hook refuses
    await client.publish("quotes/x", "1")
    topic, body = await client.receive()
    assert topic == "$remote/anon/rx/errors"
    assert "anonymous listeners do not publish" in json.loads(body)[0]["description"]


async def test_without_a_publish_hook_every_publish_is_refused(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    gateway = await serve(flywheel_bow(publish=None))
    client = await FlywheelClient.open(http, gateway.url)
    await client.bind(auth=bearer("T1", {"desk": "fx"}))
    await client.publish("quotes/x", "1")
    topic, body = await client.receive()
    assert topic == "$remote/anon/rx/errors"
    assert json.loads(body)[0]["description"] == "this gateway takes no publish from clients"
    await client.close()


async def test_a_hook_returning_an_invalid_message_is_refused(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    gateway = await serve(flywheel_bow(publish=lambda d, t, b: {"name": t, "audience": "all"}))
    client = await FlywheelClient.open(http, gateway.url)
    await client.bind(auth=bearer("T1", {"desk": "fx"}), subscribe=["#"])
    await client.publish("quotes/x", "1")
    topic, body = await client.receive()
    assert topic == "$remote/anon/rx/errors"
    assert json.loads(body)[0]["description"].startswith("invalid message: audience")
    await client.close()


async def test_publishes_past_the_rate_are_refused(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    config = base_config(outbound={"timeout": 5, "max_publishes_per_second": 3})
    gateway = await serve(flywheel_bow(config))
    client = await FlywheelClient.open(http, gateway.url)
    await client.bind(auth=bearer("T1", {"desk": "fx"}), subscribe=["quotes/#"])
    for n in range(4):
        await client.publish("quotes/x", str(n))
    frames = [await client.receive() for _ in range(4)]
    assert [frame for frame in frames if frame[0] == "quotes/x"] == [
        ("quotes/x", "0"),
        ("quotes/x", "1"),
        ("quotes/x", "2"),
    ]
    [(_, errors)] = [frame for frame in frames if frame[0] == "$remote/anon/rx/errors"]
    assert "max_publishes_per_second" in json.loads(errors)[0]["description"]
    await client.close()


async def test_an_enricher_that_raises_refuses_a_client_publish(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    def refuse(message: dict[str, Any]) -> Any:
        raise ValueError("closed market")

    gateway = await serve(flywheel_bow().enricher(filter="quotes/#", enrich=refuse))
    client = await FlywheelClient.open(http, gateway.url)
    await client.bind(auth=bearer("T1", {"desk": "fx"}), subscribe=["quotes/#"])
    await client.publish("quotes/x", "1")
    topic, body = await client.receive()
    assert topic == "$remote/anon/rx/errors"
    assert "closed market" in json.loads(body)[0]["description"]
    await client.close()


# -- direct messages -----------------------------------------------------------------------------


async def test_remote_messages_reach_only_their_session(
    gateway: Gateway, open_client: Open
) -> None:
    mine = await trader(open_client, "T1", sessionId="s-1")
    theirs = await trader(open_client, "T2", sessionId="s-2", subscribe=["#"])
    await gateway.push({"name": "$remote/s-1/rx/notes", "payload": "for s-1", "audience": QUOTES})
    await gateway.push({"name": "quotes/x", "payload": "sentinel", "audience": QUOTES})
    assert await mine.receive() == ("$remote/s-1/rx/notes", "for s-1")
    assert await theirs.receive() == ("quotes/x", "sentinel")


async def test_remote_messages_still_need_their_audience(
    gateway: Gateway, open_client: Open
) -> None:
    mine = await trader(open_client, "T1", sessionId="s-1", subscribe=["quotes/#"])
    await gateway.push({"name": "$remote/s-1/rx/x", "payload": "no", "audience": [{"desk": "eq"}]})
    await gateway.push({"name": "quotes/x", "payload": "sentinel", "audience": QUOTES})
    assert await mine.receive() == ("quotes/x", "sentinel")


# -- closes ---------------------------------------------------------------------------------------


async def test_a_binary_frame_closes_with_4000(open_client: Open) -> None:
    client = await trader(open_client)
    await client.websocket.send_bytes(b"B {}")
    code, reason = await client.closed()
    assert code == 4000 and "binary" in reason


async def test_an_unknown_frame_type_closes_with_4000(open_client: Open) -> None:
    client = await trader(open_client)
    await client.websocket.send_str("X hello")
    assert (await client.closed())[0] == 4000


async def test_an_unknown_version_closes_with_4020(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    client = await FlywheelClient.open(http, gateway.url, path="/broker?v=9")
    code, reason = await client.closed()
    assert code == 4020 and "'9'" in reason
    await client.close()


async def test_a_kick_closes_with_4005(gateway: Gateway, open_client: Open) -> None:
    client = await trader(open_client)
    await gateway.bow.disconnect(["T1"], "bye", "never")
    assert await client.closed() == (4005, "bye")


async def test_a_disconnect_message_closes_with_4006(gateway: Gateway, open_client: Open) -> None:
    client = await trader(open_client)
    await gateway.push({"name": "__disconnect", "audience": [{"__id": "T1"}]})
    assert (await client.closed())[0] == 4006


async def test_a_client_that_stops_reading_is_closed_with_4008_alone(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    config = base_config(outbound={"timeout": 5, "max_buffered_bytes": 65_536})
    gateway = await serve(flywheel_bow(config))
    slow = await FlywheelClient.open(http, gateway.url)
    fast = await FlywheelClient.open(http, gateway.url)
    for client, name in ((slow, "SLOW"), (fast, "FAST")):
        await client.bind(auth=bearer(name, {"desk": "fx"}), subscribe=["big"])
    blob = "x" * 65_536
    for n in range(64):  # 4 MiB: the slow one reads none of it
        await gateway.push({"name": "big", "payload": blob, "audience": QUOTES})
        assert (await fast.receive())[0] == "big", n
    for _ in range(300):
        if await metric(gateway, 'bow_disconnects_total{reason="slow"}') == 1:
            break
        await asyncio.sleep(0.01)
    else:
        pytest.fail("the connection that stopped reading was not dropped")
    await gateway.push({"name": "big", "payload": "still here", "audience": QUOTES})
    assert await fast.receive() == ("big", "still here")
    await fast.close()
    await slow.close()


async def test_the_token_s_expiry_warns_then_closes_with_4003(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    gateway = await serve(flywheel_bow(base_config(outbound={"timeout": 5, "expiry_grace": 0.3})))
    client = await FlywheelClient.open(http, gateway.url)
    bound = await client.bind(sessionId="s-1", auth=bearer("T1", {"desk": "fx"}, ttl=1))
    assert bound["errors"] == []
    topic, body = await client.receive(timeout=3)
    assert topic == "$remote/s-1/rx/alerts"
    assert json.loads(body)["code"] == 4100
    assert (await client.closed())[0] == 4003
    await client.close()


async def test_stopping_the_gateway_closes_with_4012(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(flywheel_bow())
    client = await FlywheelClient.open(http, f"http://127.0.0.1:{bow.port}")
    await client.bind(auth=bearer("T1", {"desk": "fx"}))
    stopping = asyncio.create_task(bow.stop())
    assert (await client.closed())[0] == 4012
    await stopping


async def test_a_client_that_answers_no_ping_is_cut_off(
    gateway: Gateway, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(liveness, "PING_EVERY", 0.1)
    monkeypatch.setattr(liveness, "PONG_WITHIN", 0.3)
    monkeypatch.setattr(liveness, "SWEEP", 0.05)
    mute = await FlywheelClient.open(http, gateway.url, autoping=False)
    polite = await FlywheelClient.open(http, gateway.url)
    for client in (mute, polite):
        await client.bind(auth=bearer("T1", {"desk": "fx"}), subscribe=["quotes/#"])
    reading = asyncio.create_task(polite.receive())  # aiohttp answers pings while it reads
    started = time.monotonic()
    await mute.closed()
    assert time.monotonic() - started < 3.0
    await asyncio.sleep(0.5)  # five more pings for the polite one
    await gateway.push({"name": "quotes/x", "payload": "alive", "audience": QUOTES})
    assert await reading == ("quotes/x", "alive")
    await mute.close()
    await polite.close()


# -- limits, metrics -----------------------------------------------------------------------------


async def test_a_frame_over_max_incoming_bytes_closes_that_connection(
    gateway: Gateway, open_client: Open
) -> None:
    client = await trader(open_client)
    await client.publish("quotes/x", "x" * 20_000)
    code, _ = await client.closed()
    assert code == 1009


async def test_connections_are_counted_by_protocol(gateway: Gateway, open_client: Open) -> None:
    client = await trader(open_client, subscribe=["quotes/#"])
    labels = 'outbound="v1",protocol="flywheel"'
    assert await metric(gateway, f"bow_sockets_connected{{{labels}}}") == 1
    assert await metric(gateway, f"bow_sockets_authenticated{{{labels}}}") == 1
    await gateway.push({"name": "quotes/x", "payload": "1", "audience": QUOTES})
    await client.receive()
    assert await metric(gateway, 'bow_deliveries_total{protocol="flywheel"}') == 1


async def test_a_plain_http_get_is_refused_with_400(gateway: Gateway) -> None:
    async with gateway.http.get(gateway.url + "/broker") as response:
        assert response.status == 400
        assert (await response.json())["code"] == 4000


# -- hostile publishes and binds (issue 27) ------------------------------------------------------


def publish_as_is(details: Mapping[str, Any] | None, topic: str, body: str) -> dict[str, Any]:
    """A publish hook that takes the topic as the message's name, to the whole desk: what a
    careless hook does, so that only the gateway's rule on names stands in the way."""
    return {"name": topic, "payload": body, "audience": QUOTES}


async def refusal(client: FlywheelClient) -> str:
    """The next frame must be the errors topic's: its description."""
    topic, body = await client.receive()
    assert topic.endswith("/rx/errors"), (topic, body)
    [error] = json.loads(body)
    return str(error["description"])


async def test_a_publish_named_disconnect_is_refused_and_closes_nobody(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    """Guards against ``P __disconnect bye`` closing every member of the desk (4006) on every
    protocol: a client may not publish the gateway's names."""
    gateway = await serve(flywheel_bow(publish=publish_as_is))
    attacker = await FlywheelClient.open(http, gateway.url)
    victim = await FlywheelClient.open(http, gateway.url)
    try:
        await attacker.bind(auth=bearer("T1", {"desk": "fx"}))
        await victim.bind(auth=bearer("T2", {"desk": "fx"}), subscribe=["quotes/#"])
        socketio = await gateway.listener(token("T3", {"desk": "fx"}), "v1")
        await attacker.publish("__disconnect", "bye")
        assert "'__disconnect' is reserved: a client may not publish" in await refusal(attacker)
        await gateway.push({"name": "quotes/x", "payload": "sentinel", "audience": QUOTES})
        assert await victim.receive() == ("quotes/x", "sentinel")
        assert await socketio.expect("quotes/x") == "sentinel"
    finally:
        await attacker.close()
        await victim.close()


@pytest.mark.parametrize("kind", ["alerts", "errors", "dm"])
async def test_a_publish_to_another_session_s_remote_topic_is_refused(
    serve: Serve, http: aiohttp.ClientSession, kind: str
) -> None:
    """Guards against ``P $remote/{victim}/rx/alerts`` reaching the victim as the gateway's
    own alert (or error) frame, written by the attacker."""
    gateway = await serve(flywheel_bow(publish=publish_as_is))
    attacker = await FlywheelClient.open(http, gateway.url)
    victim = await FlywheelClient.open(http, gateway.url)
    try:
        await attacker.bind(auth=bearer("T1", {"desk": "fx"}))
        await victim.bind(sessionId="victim-1", auth=bearer("T2", {"desk": "fx"}))
        forged = json.dumps({"code": 4100, "reason": "refresh_required", "text": "forged"})
        await attacker.publish(f"$remote/victim-1/rx/{kind}", forged)
        assert "is reserved: a client may not publish" in await refusal(attacker)
        await gateway.push({"name": "$remote/victim-1/rx/x", "payload": "real", "audience": QUOTES})
        assert await victim.receive() == ("$remote/victim-1/rx/x", "real")
    finally:
        await attacker.close()
        await victim.close()


@pytest.mark.parametrize(
    ("topic", "why"),
    [
        ("quotes/x\n{}\nforged", "must not hold a comma or a line break"),
        ("quotes/x,7,ADMIN,app,m-9,1700000000", "must not hold a comma"),
        ("quotes/\u202egnp", "nor a control or bidirectional character"),
        ("quotes/x\x00", "nor a control or bidirectional character"),
        ("quotes/x/", "has an empty level"),
        ("quotes//x", "has an empty level"),
        ("quotes/#", "has a + or # level"),
    ],
)
async def test_a_publish_whose_name_could_forge_a_frame_is_refused(
    serve: Serve, http: aiohttp.ClientSession, topic: str, why: str
) -> None:
    gateway = await serve(flywheel_bow(publish=publish_as_is))
    publisher = await FlywheelClient.open(http, gateway.url)
    subscriber = await FlywheelClient.open(http, gateway.url)
    try:
        await publisher.bind(auth=bearer("T1", {"desk": "fx"}))
        await subscriber.bind(auth=bearer("T2", {"desk": "fx"}), subscribe=["#"])
        await publisher.publish(topic, "body")
        assert why in await refusal(publisher)
        await gateway.push({"name": "quotes/x", "payload": "sentinel", "audience": QUOTES})
        assert await subscriber.receive() == ("quotes/x", "sentinel")
    finally:
        await publisher.close()
        await subscriber.close()


async def test_a_session_id_held_by_another_listener_is_refused(
    gateway: Gateway, open_client: Open
) -> None:
    """Guards against a client binding another's ``sessionId`` to read its direct messages."""
    owner = await trader(open_client, "T1", sessionId="s-owned")
    thief = await open_client()
    response = await thief.bind(sessionId="s-owned", auth=bearer("T2", {"desk": "fx"}))
    [error] = response["errors"]
    assert error["type"] == "General" and "held by another listener" in error["description"]
    anonymous = await open_client()
    assert (await anonymous.bind(sessionId="s-owned"))["errors"] != []  # anonymous: another
    await thief.bind(subscribe=["quotes/#"])
    await gateway.push({"name": "$remote/s-owned/rx/dm", "payload": "secret", "audience": QUOTES})
    await gateway.push({"name": "quotes/x", "payload": "sentinel", "audience": QUOTES})
    assert await owner.receive() == ("$remote/s-owned/rx/dm", "secret")
    assert await thief.receive() == ("quotes/x", "sentinel")


async def test_the_same_listener_may_bind_its_session_on_another_connection(
    gateway: Gateway, open_client: Open
) -> None:
    """A reconnection while the old connection lingers: the same id, the same session."""
    first = await trader(open_client, "T1", sessionId="s-mine")
    second = await trader(open_client, "T1", sessionId="s-mine")
    await gateway.push({"name": "$remote/s-mine/rx/dm", "payload": "both", "audience": QUOTES})
    assert await first.receive() == ("$remote/s-mine/rx/dm", "both")
    assert await second.receive() == ("$remote/s-mine/rx/dm", "both")


async def test_a_session_is_free_again_once_its_holders_are_gone(
    gateway: Gateway, open_client: Open
) -> None:
    first = await trader(open_client, "T1", sessionId="s-free")
    await first.close()
    await asyncio.sleep(0.2)  # the gateway sees the close
    second = await trader(open_client, "T2", sessionId="s-free")
    await gateway.push({"name": "$remote/s-free/rx/dm", "payload": "now", "audience": QUOTES})
    assert await second.receive() == ("$remote/s-free/rx/dm", "now")


async def test_an_upgrade_lets_go_of_a_session_shared_with_anonymous_connections(
    gateway: Gateway, open_client: Open
) -> None:
    """Two anonymous connections may share a session; the one that becomes a listener leaves
    it, so that it never shares a session with another identity."""
    one, two = await open_client(), await open_client()
    assert (await one.bind(sessionId="s-anon"))["errors"] == []
    assert (await two.bind(sessionId="s-anon"))["errors"] == []
    response = await one.bind(auth=bearer("T1", {"desk": "fx", "public": True}))
    assert "held by another listener" in response["errors"][0]["description"]
    anyone = [{"public": True}]
    await gateway.push({"name": "$remote/s-anon/rx/dm", "payload": "anon", "audience": anyone})
    assert await two.receive() == ("$remote/s-anon/rx/dm", "anon")
    assert await one.nothing_within(0.3)


@pytest.mark.parametrize("session", ["a b", "a,b", "a\nb", "a\u202eb", "a\x00b", "a/b"])
async def test_a_session_id_no_remote_name_could_hold_is_refused(
    open_client: Open, session: str
) -> None:
    client = await open_client()
    response = await client.bind(sessionId=session, auth=bearer("T1", {"desk": "fx"}))
    [error] = response["errors"]
    assert error["type"] == "General" and error["description"].startswith("sessionId must be")
    await client.publish("news/x", "1")  # refused by the hook: on anon, not on the session
    topic, _ = await client.receive()
    assert topic == "$remote/anon/rx/errors"
