"""The Socket.IO outbound, end to end: a refused socket gets an alert, then a disconnect, and
no other socket is touched."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import jwt
import pytest

from bow_gateway import Bow

from .support import (
    SECRET,
    Gateway,
    as_kind,
    good_or,
    lobby_or,
    plugin_bow,
    raise_,
    refused_alone,
    returns,
    token,
)

# -- refusals: alert, then a disconnect of that socket only ------------------------------------


async def test_authenticate_without_token_is_refused(gateway: Gateway) -> None:
    bystander = await gateway.jwt_listener("USER/1")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "USER/1"}])
    assert "token" in alert


async def test_authenticate_with_null_token_is_refused(gateway: Gateway) -> None:
    bystander = await gateway.jwt_listener("USER/1")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", (None,), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "USER/1"}])
    assert "token" in alert


async def test_authenticate_without_acknowledgement_callback_is_refused(gateway: Gateway) -> None:
    bystander = await gateway.jwt_listener("USER/1")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", token("USER/2"))
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "USER/1"}])
    assert "acknowledgement" in alert


@pytest.mark.parametrize(
    ("bad_token", "reason"),
    [
        ("not-a-jwt", "invalid token"),
        (token("USER/2", ttl=-60), "expired"),
        (token("USER/2").rsplit(".", 1)[0] + ".c2lnbmF0dXJl", "invalid token"),
        (
            jwt.encode({"sub": "USER/2"}, "another-secret-" + SECRET, "HS256"),
            "invalid token",
        ),
        (42, "string"),
    ],
    ids=["garbage", "expired", "bad-signature", "other-secret", "not-a-string"],
)
async def test_rejected_token_is_refused(gateway: Gateway, bad_token: Any, reason: str) -> None:
    bystander = await gateway.jwt_listener("USER/1")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", (bad_token,), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "USER/1"}])
    assert reason in alert.lower(), alert


@pytest.mark.parametrize("kind", ["plain", "coroutine"])
async def test_listener_fn_raising_is_refused(
    serve: Callable[[Bow], Awaitable[Gateway]], kind: str
) -> None:
    gateway = await serve(plugin_bow(as_kind(kind, good_or(raise_(LookupError("no such user"))))))
    bystander = await gateway.listener("good")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", ("bad",), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "GOOD"}])
    assert "no such user" in alert


@pytest.mark.parametrize(
    "details",
    [{}, {"id": True}, {"id": ""}, {"id": {"a": 1}}, {"id": None}, {"id": [1]}, None, "GOOD"],
    ids=["missing", "true", "empty", "dict", "null", "list", "none", "not-a-mapping"],
)
@pytest.mark.parametrize("kind", ["plain", "coroutine"])
async def test_listener_fn_returning_no_valid_id_is_refused(
    serve: Callable[[Bow], Awaitable[Gateway]], kind: str, details: Any
) -> None:
    gateway = await serve(plugin_bow(as_kind(kind, good_or(returns(details)))))
    bystander = await gateway.listener("good")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", ("bad",), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "GOOD"}])
    assert "id" in alert or "mapping" in alert, alert


@pytest.mark.parametrize("kind", ["plain", "coroutine"])
async def test_criteria_fn_raising_is_refused(
    serve: Callable[[Bow], Awaitable[Gateway]], kind: str
) -> None:
    criteria_fn = as_kind(kind, lobby_or(raise_(RuntimeError("database down"))))
    gateway = await serve(plugin_bow(lambda t: {"id": t.upper()}, criteria_fn))
    bystander = await gateway.listener("good")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", ("bad",), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"room": "lobby"}])
    assert "criteria" in alert and "BAD" in alert, alert


async def test_criteria_fn_raising_lookup_error_is_refused_with_its_message(
    serve: Callable[[Bow], Awaitable[Gateway]],
) -> None:
    # A middleware that does not know a listener (the precomputed one) says so to the client.
    criteria_fn = lobby_or(raise_(LookupError("listener 'BAD' has no precomputed criteria")))
    gateway = await serve(plugin_bow(lambda t: {"id": t.upper()}, criteria_fn))
    bystander = await gateway.listener("good")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", ("bad",), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"room": "lobby"}])
    assert alert == "auth_refused: listener 'BAD' has no precomputed criteria"


@pytest.mark.parametrize(
    "criteria",
    [
        {"room": {"nested": 1}},
        {"room": ""},
        {"room": None},
        {"room": [["nested"]]},
        {"room": [""]},
        {"room": [{"a": 1}]},
        {"room": float("nan")},
        {1: "numeric-key"},
        ["room", "lobby"],
        None,
    ],
    ids=[
        "nested-dict",
        "empty-string",
        "null",
        "nested-list",
        "list-of-empty-string",
        "list-of-dict",
        "nan",
        "non-string-key",
        "list",
        "none",
    ],
)
@pytest.mark.parametrize("kind", ["plain", "coroutine"])
async def test_criteria_fn_returning_invalid_criteria_is_refused(
    serve: Callable[[Bow], Awaitable[Gateway]], kind: str, criteria: Any
) -> None:
    criteria_fn = as_kind(kind, lobby_or(returns(criteria)))
    gateway = await serve(plugin_bow(lambda t: {"id": t.upper()}, criteria_fn))
    bystander = await gateway.listener("good")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", ("bad",), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"room": "lobby"}])
    assert "criteria" in alert, alert


@pytest.mark.parametrize("own_id", ["BAD", "GOOD", 1])
async def test_criteria_setting_id_themselves_are_refused(
    serve: Callable[[Bow], Awaitable[Gateway]], own_id: Any
) -> None:
    criteria_fn = lobby_or(returns({"room": "lobby", "__id": own_id}))
    gateway = await serve(plugin_bow(lambda t: {"id": t.upper()}, criteria_fn))
    bystander = await gateway.listener("good")
    victim = await gateway.connect()
    await victim.client.emit("authenticate", ("bad",), callback=lambda *_: None)
    alert = await refused_alone(gateway, victim, bystander, [{"__id": "GOOD"}])
    assert "__id" in alert, alert


async def test_refused_authentication_leaves_the_ids_other_sockets_untouched(
    gateway: Gateway,
) -> None:
    first = await gateway.jwt_listener("USER/1", {"room": "a"})
    victim = await gateway.connect()
    await victim.client.emit(
        "authenticate", (token("USER/1", {"room": {"x": 1}}),), callback=lambda *_: None
    )
    await refused_alone(gateway, victim, first, [{"room": "a"}])
    await gateway.sentinel([{"__id": "USER/1"}], first)
