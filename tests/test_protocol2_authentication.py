"""Protocol 2, end to end (sections 8 and 10): re-authentication, expiry, anonymous listeners,
the identity rule, limits, and the alerts that carry the codes.

Tokens are either JWTs (strings, the bundled outbound) or plain mappings ``{"id", "exp",
"criteria"}`` that the test's listener function turns into details, so that ``exp`` can be any
instant (JWT ``exp`` are whole seconds).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from bow_gateway.outbounds.jwt import JwtOutbound, mint

from bow_gateway import Bow

from .support import SECRET, WAIT, Gateway, base_config, token
from .support.protocol2 import INFO_KEYS, P2, P2Gateway, closed_with, info_of, p2_bow

BLOG_42 = [{"blogId": 42}]
BLOG_7 = [{"blogId": 7}]
JWT = JwtOutbound(secret=SECRET)


def listener_fn(listener_token: Any) -> dict[str, Any]:
    """A JWT (a string) as the bundled outbound reads it; a mapping ``{"id", "exp",
    "criteria"}`` as those details, ``exp`` included when given."""
    if isinstance(listener_token, str):
        return JWT(listener_token)
    details: dict[str, Any] = {
        "id": listener_token["id"],
        "claims": {"criteria": listener_token.get("criteria", {})},
    }
    if "exp" in listener_token:
        details["exp"] = listener_token["exp"]
    return details


def expiring(listener_id: str, seconds: float, criteria: Any = None) -> dict[str, Any]:
    """A token of ``listener_id`` whose details expire ``seconds`` from now."""
    return {"id": listener_id, "exp": time.time() + seconds, "criteria": criteria or {}}


Serve = Callable[..., Awaitable[P2Gateway]]


@pytest.fixture
async def serve(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> AsyncIterator[Serve]:
    """``gateway = await serve(anonymous_criteria=..., **config)``: :func:`p2_bow` with this
    module's listener function and ``config`` overriding top-level sections (the outbound's
    timeout stays 5 s), its watcher connected. Its clients are closed before it stops."""
    gateways: list[P2Gateway] = []

    async def start(anonymous_criteria: Any = None, **config: Any) -> P2Gateway:
        config["outbound"] = {"timeout": 5, **config.get("outbound", {})}
        bow = p2_bow(
            base_config(**config), listener_fn=listener_fn, anonymous_criteria=anonymous_criteria
        )
        gateway = P2Gateway(Gateway(await start_bow(bow), http))
        gateways.append(gateway)
        await gateway.watch()
        return gateway

    yield start
    for gateway in gateways:
        await gateway.close()


def number(position: str) -> int:
    """The memory backplane's position ``epoch.n`` as ``n`` (clients never parse positions:
    a test may, to check an order)."""
    return int(position.rpartition(".")[2])


# -- re-authentication and expiry ------------------------------------------------------------


async def test_ack_expires_in_gives_the_seconds_left(serve: Serve) -> None:
    gateway = await serve()
    _, ack = await gateway.listener(expiring("USER/1", 30))
    assert 29 < ack["expires_in"] <= 30


async def test_ack_expires_in_is_null_without_exp(serve: Serve) -> None:
    gateway = await serve()
    _, ack = await gateway.listener({"id": "USER/1"})
    assert ack["expires_in"] is None


async def test_a_jwts_exp_gives_expires_in(serve: Serve) -> None:
    gateway = await serve()
    _, ack = await gateway.listener(mint("USER/1", SECRET, ttl=60))
    assert ack["expires_in"] is not None and 58 < ack["expires_in"] <= 60


async def test_refresh_before_exp_gives_no_alert_and_a_new_expires_in(serve: Serve) -> None:
    gateway = await serve(outbound={"expiry_grace": 0.5})
    client, first = await gateway.listener(expiring("USER/1", 0.8))
    assert 0 < first["expires_in"] <= 0.8
    await asyncio.sleep(0.3)
    again = await client.authenticate(expiring("USER/1", 30))
    assert again["id"] == "USER/1"
    assert 29 < again["expires_in"] <= 30
    await asyncio.sleep(1.2)  # past the first exp and its grace
    await gateway.sentinel([{"__id": "USER/1"}], client)
    assert client.alerts == [] and client.client.connected


async def test_without_refresh_4100_at_exp_delivery_goes_on_then_4003_at_exp_plus_grace(
    serve: Serve,
) -> None:
    gateway = await serve(outbound={"expiry_grace": 1})
    exp_in = 1.0
    started = time.monotonic()
    client, _ = await gateway.listener(expiring("USER/1", exp_in))
    args = await client.expect("alert", timeout=3)
    warned = time.monotonic() - started
    assert info_of(args) == {
        "code": 4100,
        "reason": "refresh_required",
        "fatal": False,
        "reconnect": "new_token",
    }
    assert abs(warned - exp_in) < 0.5, warned
    await gateway.sentinel([{"__id": "USER/1"}], client)  # still delivered within the grace
    info = await closed_with(client, 4003)
    assert info == {
        "code": 4003,
        "reason": "token_expired",
        "fatal": True,
        "reconnect": "new_token",
    }
    assert client.disconnected_at is not None
    assert abs(client.disconnected_at - started - (exp_in + 1)) < 0.5


async def test_a_refresh_within_the_grace_cancels_the_expiry(serve: Serve) -> None:
    gateway = await serve(outbound={"expiry_grace": 1})
    client, _ = await gateway.listener(expiring("USER/1", 0.5))
    assert info_of(await client.expect("alert", timeout=3))["code"] == 4100
    ack = await client.authenticate(expiring("USER/1", 30))
    assert ack["expires_in"] > 29
    await asyncio.sleep(1.3)  # past exp + grace of the first token
    await gateway.sentinel([{"__id": "USER/1"}], client)
    assert [info_of(alert)["code"] for alert in client.alerts] == [4100]
    assert client.client.connected


@pytest.mark.parametrize("exp", ["2099-01-01", True, [1]], ids=["string", "bool", "list"])
async def test_an_exp_that_is_not_a_number_gets_4002(serve: Serve, exp: Any) -> None:
    gateway = await serve()
    client = await gateway.connect()
    await client.authenticate_unacked({"id": "USER/1", "exp": exp})
    assert (await closed_with(client, 4002))["reason"] == "auth_refused"


async def test_a_refresh_with_an_expired_token_gets_4003(serve: Serve) -> None:
    gateway = await serve()
    client, _ = await gateway.listener(expiring("USER/1", 30))
    await client.authenticate_unacked(expiring("USER/1", -1))
    assert (await closed_with(client, 4003))["reason"] == "token_expired"


async def test_an_already_expired_jwt_gets_4003_as_the_docs_say(serve: Serve) -> None:
    # Regression (issue 27): the JWT outbound refused it as any invalid token, 4002.
    gateway = await serve()
    client = await gateway.connect()
    await client.authenticate_unacked(mint("USER/1", SECRET, ttl=-10))
    info = await closed_with(client, 4003)
    assert info["reason"] == "token_expired" and info["reconnect"] == "new_token"
    refreshed, _ = await gateway.listener(token("USER/1"))
    await refreshed.authenticate_unacked(mint("USER/1", SECRET, ttl=-10))  # a refresh too
    assert (await closed_with(refreshed, 4003))["reason"] == "token_expired"


async def test_a_refresh_with_a_refused_token_gets_4002_and_the_old_one_does_not_linger(
    serve: Serve,
) -> None:
    gateway = await serve()
    client, _ = await gateway.listener(token("USER/1", {"blogId": 42}))
    acks = await client.authenticate_unacked("not-a-jwt")
    await closed_with(client, 4002)
    assert acks == []


async def test_a_refresh_with_other_criteria_applies_from_the_acks_position_never_a_mix(
    serve: Serve,
) -> None:
    gateway = await serve()
    client, _ = await gateway.listener(token("USER/1", {"blogId": 42}))
    await gateway.sentinel(BLOG_42, client)

    async def stream() -> list[tuple[str, str]]:
        pushed = []
        for i in range(40):
            audience = BLOG_42 if i % 2 == 0 else BLOG_7
            name = f"to-{audience[0]['blogId']}-{i}"
            pushed.append((name, await gateway.push({"name": name, "audience": audience})))
            await asyncio.sleep(0.005)
        return pushed

    pushing = asyncio.create_task(stream())
    await asyncio.sleep(0.1)
    ack = await client.authenticate(token("USER/1", {"blogId": 7}))
    pushed = await pushing
    switch = number(ack["position"])
    await gateway.settle()
    sentinel = await gateway.sentinel(BLOG_7)
    received: list[str] = []
    while True:
        name, (_, meta) = await client.next()
        if meta["position"] == sentinel:
            break
        received.append(name)
    expected = [
        name
        for name, position in pushed
        if (name.startswith("to-42-") and number(position) <= switch)
        or (name.startswith("to-7-") and number(position) > switch)
    ]
    assert received == expected
    # The switch fell within the stream (else this shows nothing).
    assert any(name.startswith("to-42-") for name in expected)
    assert any(name.startswith("to-7-") for name in expected)


async def test_a_refresh_with_other_criteria_changes_what_the_socket_receives(
    serve: Serve,
) -> None:
    gateway = await serve()
    client, _ = await gateway.listener(token("USER/1", {"blogId": 42}))
    await gateway.sentinel(BLOG_42, client)
    ack = await client.authenticate(token("USER/1", {"blogId": 7}))
    assert ack["id"] == "USER/1" and isinstance(ack["position"], str)
    await gateway.push({"name": "old-blog", "audience": BLOG_42})
    await gateway.sentinel(BLOG_7, client)


async def test_authenticate_takes_token_and_ack_without_options(serve: Serve) -> None:
    gateway = await serve()
    client = await gateway.connect()
    ack = await client.authenticate(token("USER/1"))
    assert ack["id"] == "USER/1" and ack["recovered"] is None


async def test_options_that_are_not_a_mapping_get_4000(serve: Serve) -> None:
    gateway = await serve()
    client = await gateway.connect()
    await client.authenticate_unacked(token("USER/1"), ["since"])
    info = await closed_with(client, 4000)
    assert info["reason"] == "bad_request" and info["reconnect"] == "never"


# -- anonymous listeners and identity --------------------------------------------------------


async def test_anonymous_gets_public_messages_only_then_upgrades_to_an_id(serve: Serve) -> None:
    gateway = await serve(anonymous_criteria={"public": True})
    client, ack = await gateway.listener(None, {})
    assert ack["id"] is None and ack["expires_in"] is None
    assert isinstance(ack["position"], str)
    await gateway.push({"name": "news", "payload": 1, "audience": [{"public": True}]})
    assert (await client.expect("news"))[0] == 1
    await gateway.push({"name": "private", "audience": [{"__id": "USER/1"}]})
    await gateway.sentinel([{"public": True}], client)
    upgraded = await client.authenticate(token("USER/1"))
    assert upgraded["id"] == "USER/1"
    await gateway.sentinel([{"__id": "USER/1"}], client)
    assert client.alerts == [] and client.client.connected


async def test_anonymous_is_refused_when_the_outbound_has_no_anonymous_criteria(
    serve: Serve,
) -> None:
    gateway = await serve()
    client = await gateway.connect()
    await client.authenticate_unacked(None, {})
    assert (await closed_with(client, 4000))["reason"] == "bad_request"


async def test_an_id_change_gets_4004(serve: Serve) -> None:
    gateway = await serve()
    client, _ = await gateway.listener(token("USER/1"))
    acks = await client.authenticate_unacked(token("USER/2"))
    info = await closed_with(client, 4004)
    assert info == {"code": 4004, "reason": "id_changed", "fatal": True, "reconnect": "now"}
    assert acks == []


async def test_an_id_going_back_to_anonymous_gets_4004(serve: Serve) -> None:
    gateway = await serve(anonymous_criteria={"public": True})
    client, _ = await gateway.listener(token("USER/1"))
    await client.authenticate_unacked(None, {})
    await closed_with(client, 4004)


async def test_protocol_1_still_ignores_a_second_authenticate(serve: Serve) -> None:
    gateway = await serve()
    client, ack = await gateway.listener(token("USER/1", {"blogId": 42}), proto="1")
    assert ack is None
    acks = await client.authenticate_unacked(token("USER/2", {"blogId": 7}))
    await gateway.push({"name": "as-user-2", "audience": [{"__id": "USER/2"}, *BLOG_7]})
    await gateway.push({"name": "as-user-1", "audience": BLOG_42})
    assert await client.expect("as-user-1") == ()
    assert acks == [] and client.alerts == [] and client.client.connected


# -- limits ----------------------------------------------------------------------------------


async def test_authenticate_over_the_rate_gets_4011(serve: Serve) -> None:
    gateway = await serve(outbound={"max_authenticates_per_minute": 3})
    client, _ = await gateway.listener(token("USER/1"))
    for _ in range(2):  # the first one counts: 3 in all are served
        assert (await client.authenticate(token("USER/1")))["id"] == "USER/1"
    acks = await client.authenticate_unacked(token("USER/1"))
    info = await closed_with(client, 4011)
    assert info["reason"] == "too_many_requests" and info["reconnect"] == "backoff"
    assert acks == []


async def test_the_socket_of_an_id_over_max_sockets_per_id_gets_4009(serve: Serve) -> None:
    gateway = await serve(outbound={"max_sockets_per_id": 2})
    first, _ = await gateway.listener(token("USER/1"))
    second, _ = await gateway.listener(token("USER/1"))
    third = await gateway.connect()
    await third.authenticate_unacked(token("USER/1"))
    info = await closed_with(third, 4009)
    assert info["reason"] == "too_many_sockets" and info["reconnect"] == "backoff"
    await gateway.sentinel([{"__id": "USER/1"}], first, second)  # the older ones stay


async def test_a_place_left_by_a_socket_of_the_id_can_be_taken(serve: Serve) -> None:
    gateway = await serve(outbound={"max_sockets_per_id": 2})
    first, _ = await gateway.listener(token("USER/1"))
    second, _ = await gateway.listener(token("USER/1"))
    await first.close()
    await asyncio.sleep(0.1)  # the gateway sees it leave
    third, ack = await gateway.listener(token("USER/1"))
    assert ack["id"] == "USER/1"
    await gateway.sentinel([{"__id": "USER/1"}], second, third)


async def test_anonymous_sockets_past_max_anonymous_get_4009(serve: Serve) -> None:
    # Regression (issue 27): anonymous sockets had no bound but max_sockets.
    gateway = await serve(anonymous_criteria={"public": True}, outbound={"max_anonymous": 2})
    first, _ = await gateway.listener(None, {})
    second, _ = await gateway.listener(None, {})
    third = await gateway.connect()
    await third.authenticate_unacked(None, {})
    info = await closed_with(third, 4009)
    assert info["reason"] == "too_many_sockets" and info["reconnect"] == "backoff"
    _, ack = await gateway.listener(token("USER/1"))  # an id is not anonymous
    assert ack["id"] == "USER/1"
    await gateway.sentinel([{"public": True}], first, second)  # the older ones stay
    assert (await first.authenticate(token("USER/2")))["id"] == "USER/2"  # its place is freed
    fourth, ack = await gateway.listener(None, {})
    assert ack["id"] is None
    await gateway.sentinel([{"public": True}], second, fourth)


async def test_stopping_the_gateway_sends_4012_to_a_protocol_2_socket(serve: Serve) -> None:
    gateway = await serve()
    client, _ = await gateway.listener(token("USER/1"))
    await gateway.bow.stop()
    info = await closed_with(client, 4012)
    assert info == {"code": 4012, "reason": "shutdown", "fatal": True, "reconnect": "now"}


async def test_a_disconnect_message_gives_a_protocol_2_socket_alert_4006(serve: Serve) -> None:
    gateway = await serve()
    client, _ = await gateway.listener(token("USER/1", {"blogId": 42}))
    await gateway.push({"name": "__disconnect", "audience": BLOG_42})
    info = await closed_with(client, 4006)
    assert info == {
        "code": 4006,
        "reason": "disconnect_message",
        "fatal": True,
        "reconnect": "backoff",
    }


async def test_a_disconnect_message_leaves_a_protocol_1_socket_without_alert(
    serve: Serve,
) -> None:
    gateway = await serve()
    client, _ = await gateway.listener(token("USER/1", {"blogId": 42}), proto="1")
    await gateway.push({"name": "__disconnect", "audience": BLOG_42})
    await client.wait_disconnected()
    assert client.names == ["disconnect"]


# -- every fatal alert ---------------------------------------------------------------------


async def _refused(gateway: P2Gateway) -> P2:
    client = await gateway.connect()
    await client.authenticate_unacked("not-a-jwt")
    return client


async def _expired(gateway: P2Gateway) -> P2:
    client = await gateway.connect()
    await client.authenticate_unacked(expiring("USER/1", -1))
    return client


async def _id_changed(gateway: P2Gateway) -> P2:
    client, _ = await gateway.listener(token("USER/1"))
    await client.authenticate_unacked(token("USER/2"))
    return client


async def _kicked(gateway: P2Gateway) -> P2:
    client, _ = await gateway.listener(token("USER/1"))
    await gateway.bow.disconnect(["USER/1"], "bye")
    return client


async def _disconnect_message(gateway: P2Gateway) -> P2:
    client, _ = await gateway.listener(token("USER/1"))
    await gateway.push({"name": "__disconnect", "audience": [{"__id": "USER/1"}]})
    return client


async def _too_many_sockets(gateway: P2Gateway) -> P2:
    for _ in range(2):
        await gateway.listener(token("USER/1"))
    client = await gateway.connect()
    await client.authenticate_unacked(token("USER/1"))
    return client


async def _too_many_requests(gateway: P2Gateway) -> P2:
    client, _ = await gateway.listener(token("USER/1"))
    await client.authenticate(token("USER/1"))
    await client.authenticate_unacked(token("USER/1"))
    return client


async def _token_expired_after_grace(gateway: P2Gateway) -> P2:
    client, _ = await gateway.listener(expiring("USER/1", 0.2))
    return client


async def _auth_timeout(gateway: P2Gateway) -> P2:
    return await gateway.connect()


@pytest.mark.parametrize(
    ("cause", "code"),
    [
        (_refused, 4002),
        (_expired, 4003),
        (_token_expired_after_grace, 4003),
        (_id_changed, 4004),
        (_kicked, 4005),
        (_disconnect_message, 4006),
        (_too_many_sockets, 4009),
        (_too_many_requests, 4011),
        (_auth_timeout, 4001),
    ],
    ids=lambda value: value.__name__.strip("_") if callable(value) else str(value),
)
async def test_every_fatal_alert_is_followed_by_a_disconnect_within_a_second(
    serve: Serve, cause: Callable[[P2Gateway], Awaitable[P2]], code: int
) -> None:
    gateway = await serve(
        outbound={
            "timeout": 1,
            "expiry_grace": 0.2,
            "max_sockets_per_id": 2,
            "max_authenticates_per_minute": 2,
        }
    )
    client = await cause(gateway)
    await closed_with(client, code)


async def test_alert_info_has_exactly_code_reason_fatal_reconnect(serve: Serve) -> None:
    gateway = await serve(outbound={"expiry_grace": 0.3})
    client, _ = await gateway.listener(expiring("USER/1", 0.2))
    await client.wait_disconnected(WAIT)
    infos = [info_of(alert) for alert in client.alerts]
    assert [(info["code"], info["fatal"]) for info in infos] == [(4100, False), (4003, True)]
    for info in infos:
        assert set(info) == INFO_KEYS
        assert isinstance(info["reason"], str)
        assert info["reconnect"] in ("now", "backoff", "new_token", "never")
