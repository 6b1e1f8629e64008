"""Contract section 9, as sockets see it: criteria replaced or revoked, kicks, counts (one
instance, in-process; tests/test_control_instances.py runs them across instances)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .support import AUTH, Gateway, base_config, standard_bow, token

Serve = Callable[..., Awaitable[Gateway]]


async def control(gateway: Gateway, path: str, body: Any) -> tuple[int, Any]:
    async with gateway.http.post(f"{gateway.url}/_bow/{path}", json=body, headers=AUTH) as response:
        data = await response.json() if response.status == 200 else await response.text()
        return response.status, data


async def test_revoking_then_posting_reaches_the_id_only_through_its_id(serve: Serve) -> None:
    gateway = await serve(standard_bow(base_config()))
    admin = await gateway.jwt_listener("X", {"role": "admin"})
    other = await gateway.jwt_listener("Y", {"role": "admin"})
    assert await control(gateway, "criteria", {"id": "X", "criteria": {}}) == (204, "")
    await gateway.push({"name": "secret", "audience": [{"role": "admin"}]})
    await other.expect("secret")
    await gateway.sentinel([{"__id": "X"}], admin)  # the secret never came before it


async def test_new_criteria_apply_to_every_socket_of_the_id(serve: Serve) -> None:
    gateway = await serve(standard_bow(base_config()))
    phone = await gateway.jwt_listener("X", {"role": "reader"})
    laptop = await gateway.jwt_listener("X", {"role": "reader"})
    status, _ = await control(gateway, "criteria", [{"id": "X", "criteria": {"role": "admin"}}])
    assert status == 204
    await gateway.sentinel([{"role": "admin"}], phone, laptop)


async def test_kicking_an_id_sends_4005_with_the_reason_and_advice_then_disconnects(
    serve: Serve,
) -> None:
    gateway = await serve(standard_bow(base_config()))
    kicked = await gateway.connect("v1.3&proto=2")
    await kicked.client.call("authenticate", (token("X"), {}), timeout=5)
    bystander = await gateway.jwt_listener("Y")
    body = {"ids": ["X"], "reason": "account closed", "reconnect": "never"}
    assert (await control(gateway, "disconnect", body))[0] == 204
    await kicked.wait_disconnected(1.5)
    assert kicked.alerts == ["account closed"]
    event, _ = kicked.log[0], None
    assert event == "alert"
    await gateway.sentinel([{"__id": "Y"}], bystander)


async def test_count_says_how_many_sockets_and_listeners_match_now(serve: Serve) -> None:
    gateway = await serve(standard_bow(base_config()))
    for listener_id in ("A", "A", "B"):
        await gateway.jwt_listener(listener_id, {"role": "admin"})
    await gateway.jwt_listener("C", {"role": "reader"})
    status, answer = await control(gateway, "count", {"audience": [{"role": "admin"}]})
    assert (status, answer) == (200, {"sockets": 3, "listeners": 2, "complete": True})


async def test_embedded_twins_do_what_the_endpoints_do(serve: Serve) -> None:
    gateway = await serve(standard_bow(base_config()))
    client = await gateway.jwt_listener("X", {"role": "reader"})
    assert await gateway.bow.count([{"__id": "X"}]) == {
        "sockets": 1,
        "listeners": 1,
        "complete": True,
    }
    await gateway.bow.set_criteria({"id": "X", "criteria": {"role": "admin"}})
    await gateway.sentinel([{"role": "admin"}], client)
    await gateway.bow.disconnect(["X"], reason="bye")
    await client.wait_disconnected(1.5)
