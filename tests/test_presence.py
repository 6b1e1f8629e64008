"""Presence (contract section 18): ``POST /_bow/presence`` and ``/_bow/online``, on one instance
and across two through Redis, every protocol counted, and ``Bow.presence`` / ``Bow.online``."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bow_gateway import Bow

from .support import AUTH, until
from .support.mixed_clients import Mixed

StartBow = Callable[[Bow], Awaitable[Bow]]
DESK = [{"desk": "fx"}]


@pytest.fixture
def gateways(
    serve_mixed: Callable[..., Awaitable[Mixed]],
) -> Callable[..., Awaitable[Mixed]]:
    """``await gateways(**config)``: a running gateway of every protocol (conftest)."""
    return serve_mixed


async def ask(gateway: Mixed, what: str, body: Any) -> tuple[int, Any]:
    async with gateway.http.post(f"{gateway.url}/_bow/{what}", json=body, headers=AUTH) as response:
        if response.status == 200:
            return 200, await response.json()
        return response.status, await response.text()


async def test_presence_lists_the_matching_listeners_in_order_and_counts_every_socket(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    await gateway.socketio("USER/2", {"desk": "fx"})
    await gateway.socketio("USER/1", {"desk": "fx"})
    await gateway.flywheel("USER/1", {"desk": "fx"})  # a second socket of USER/1
    await gateway.sse("USER/3", {"desk": "fx"})
    await gateway.socketio("USER/9", {"desk": "eq"})  # not the audience
    status, answer = await ask(gateway, "presence", {"audience": DESK})
    assert status == 200, answer
    assert answer == {
        "listeners": ["USER/1", "USER/2", "USER/3"],
        "sockets": 4,
        "protocols": {"socketio": 2, "flywheel": 1, "sse": 1, "gobbler": 0},
        "next": None,
        "complete": True,
    }


async def test_presence_pages_in_order_with_next_until_null(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    for n in range(5):
        await gateway.socketio(f"USER/{n}", {"desk": "fx"})
    seen: list[str] = []
    cursor = None
    for _ in range(3):
        status, page = await ask(
            gateway, "presence", {"audience": DESK, "limit": 2, "cursor": cursor}
        )
        assert status == 200 and page["sockets"] == 5, page
        seen += page["listeners"]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == [f"USER/{n}" for n in range(5)]
    assert cursor is None


async def test_online_answers_those_of_the_ids_connected_in_the_order_asked(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    await gateway.socketio("USER/1", {"desk": "fx"})
    await gateway.flywheel("USER/7", {"desk": "eq"})
    status, answer = await ask(gateway, "online", {"ids": ["USER/7", "USER/5", "USER/1"]})
    assert (status, answer) == (200, {"online": ["USER/7", "USER/1"], "complete": True})


async def test_a_listener_gone_is_no_longer_present(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    client = await gateway.socketio("USER/1", {"desk": "fx"})
    assert (await ask(gateway, "online", {"ids": ["USER/1"]}))[1]["online"] == ["USER/1"]
    await client.close()
    await until(lambda: gateway.listeners() == 0, "the socket let go")
    status, answer = await ask(gateway, "online", {"ids": ["USER/1"]})
    assert (status, answer["online"]) == (200, [])


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"audience": DESK, "limit": 0}, "limit: must be an integer from 1 to 10000"),
        ({"audience": DESK, "limit": 10_001}, "limit: must be an integer from 1 to 10000"),
        ({"audience": DESK, "limit": "10"}, "limit: must be an integer"),
        ({"audience": DESK, "cursor": 5}, "cursor: must be a previous answer's next"),
        ({"audience": DESK, "page": 1}, "page: Unknown field."),
        ({"limit": 10}, "audience: Missing data for required field."),
        ({"audience": [{}]}, "audience"),
    ],
    ids=[
        "limit-0",
        "limit-over",
        "limit-string",
        "cursor-number",
        "unknown",
        "no-audience",
        "empty-query",
    ],
)
async def test_a_bad_presence_request_is_422_naming_the_field(
    gateways: Callable[..., Awaitable[Mixed]], body: Any, error: str
) -> None:
    gateway = await gateways()
    status, text = await ask(gateway, "presence", body)
    assert status == 422 and error in text, (status, text)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"ids": "USER/1"}, "ids: must be a list"),
        ({"ids": [True]}, "ids.0: not a listener id"),
        ({"ids": ["x"] * 10_001}, "ids: at most 10000"),
        ({"ids": [], "more": 1}, 'the body must be {"ids": [...]}'),
    ],
    ids=["not-a-list", "boolean", "too-many", "unknown"],
)
async def test_a_bad_online_request_is_422_naming_the_fault(
    gateways: Callable[..., Awaitable[Mixed]], body: Any, error: str
) -> None:
    gateway = await gateways()
    status, text = await ask(gateway, "online", body)
    assert status == 422 and error in text, (status, text)


async def test_two_instances_answer_as_one(gateways: Callable[..., Awaitable[Mixed]]) -> None:
    config = {"redis": "redis://127.0.0.1:6379/0", "namespace": f"presence-{uuid.uuid4().hex[:8]}"}
    a, b = await gateways(**config), await gateways(**config)
    await a.socketio("USER/1", {"desk": "fx"})
    await b.socketio("USER/1", {"desk": "fx"})  # one listener, a socket on each instance
    await b.sse("USER/2", {"desk": "fx"})
    await a.flywheel("USER/3", {"desk": "eq"})
    status, answer = await ask(a, "presence", {"audience": DESK, "limit": 1})
    assert status == 200 and answer["complete"] is True, answer
    assert answer["listeners"] == ["USER/1"] and answer["next"] is not None
    assert answer["sockets"] == 3
    assert answer["protocols"] == {"socketio": 2, "flywheel": 0, "sse": 1, "gobbler": 0}
    status, rest = await ask(
        b, "presence", {"audience": DESK, "limit": 1, "cursor": answer["next"]}
    )
    assert rest["listeners"] == ["USER/2"] and rest["next"] is None, rest
    status, online = await ask(b, "online", {"ids": ["USER/3", "USER/4", "USER/1"]})
    assert online == {"online": ["USER/3", "USER/1"], "complete": True}


async def test_bow_presence_and_online_answer_as_the_endpoints(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    await gateway.socketio("USER/1", {"desk": "fx"})
    presence = await gateway.bow.presence(DESK, limit=10)
    assert presence["listeners"] == ["USER/1"] and presence["sockets"] == 1
    assert (await gateway.bow.online(["USER/1", "USER/2"]))["online"] == ["USER/1"]
    with pytest.raises(ValueError, match="limit"):
        await gateway.bow.presence(DESK, limit=0)
