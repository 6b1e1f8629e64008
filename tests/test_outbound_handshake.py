"""The Socket.IO outbound, end to end: the handshake (the version query, the namespace)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from bow_gateway import Bow

from .support import (
    Gateway,
    connect_error,
    plugin_bow,
)

# -- handshake: the version query and the namespace ------------------------------------------


def two_outbounds() -> Bow:
    """Outbounds v1.3 and v2 whose listener ids say which one made them."""
    return plugin_bow(lambda t: {"id": f"v1.3/{t}"}, lambda details: {}).outbound(
        version="v2",
        create_listener_details_from_token=lambda t: {"id": f"v2/{t}"},
        middleware_version="v1.1",
    )


@pytest.mark.parametrize("v", ["1.3", "v1.3"])
async def test_version_query_with_or_without_leading_v_reaches_outbound_v1_3(
    serve: Callable[[Bow], Awaitable[Gateway]], v: str
) -> None:
    gateway = await serve(two_outbounds())
    client = await gateway.listener("me", version=v)
    await gateway.sentinel([{"__id": "v1.3/me"}], client)


@pytest.mark.parametrize("v", ["2", "v2"])
async def test_version_query_selects_among_several_outbounds(
    serve: Callable[[Bow], Awaitable[Gateway]], v: str
) -> None:
    gateway = await serve(two_outbounds())
    client = await gateway.listener("me", version=v)
    await gateway.push({"name": "for-v1.3", "audience": [{"__id": "v1.3/me"}]})
    await gateway.sentinel([{"__id": "v2/me"}], client)


async def test_missing_version_is_refused_with_connect_error_saying_why(gateway: Gateway) -> None:
    data = await connect_error(gateway.url)
    message = data["message"]
    assert "version" in message and "v=" in message, message


async def test_empty_version_is_refused_with_connect_error(gateway: Gateway) -> None:
    data = await connect_error(gateway.url + "?v=")
    assert "version" in data["message"], data


async def test_unknown_version_is_refused_with_connect_error_naming_it(gateway: Gateway) -> None:
    data = await connect_error(gateway.url + "?v=v9.9")
    message = data["message"]
    assert "unknown outbound version" in message and "v9.9" in message, message
    assert "v1.3" in message, message  # and says what is served


async def test_other_namespace_is_refused_with_connect_error_saying_why(gateway: Gateway) -> None:
    data = await connect_error(gateway.url + "?v=1.3", namespace="/admin")
    message = data["message"]
    assert "namespace" in message and "/admin" in message, message


async def test_refused_handshake_leaves_other_sockets_served(gateway: Gateway) -> None:
    bystander = await gateway.jwt_listener("USER/1")
    await connect_error(gateway.url)
    await connect_error(gateway.url + "?v=1.3", namespace="/admin")
    await gateway.sentinel([{"__id": "USER/1"}], bystander)
