"""Versions are named as configured (``v1.3``, not ``'1.3'``) in errors, logs and metric labels,
while ``?v=1.3`` and ``?v=v1.3`` still reach the same outbound."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
import socketio
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound

from bow_gateway import Bow
from bow_gateway.app.standalone import build_bow, load_settings

from .support import SECRET, Listener, base_config, jwt_config_file, standard_bow, token

StartBow = Callable[[Bow], Awaitable[Bow]]


async def metrics(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url + "/metrics") as response:
        return await response.text()


@pytest.mark.parametrize("v", ["1.3", "v1.3"])
async def test_either_spelling_connects_and_is_labelled_as_configured(
    start_bow: StartBow,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    v: str,
) -> None:
    caplog.set_level(logging.INFO, logger="bow_gateway.outbound")
    bow = await start_bow(standard_bow())
    url = f"http://127.0.0.1:{bow.port}"
    listener = Listener(url)
    await listener.connect(v)
    await listener.authenticate(token("USER/1"))
    text = await metrics(http, url)
    await listener.close()
    assert 'bow_sockets_authenticated{outbound="v1.3",protocol="socketio"} 1.0' in text
    assert 'bow_authentications_total{outbound="v1.3",outcome="accepted"} 1.0' in text
    assert 'outbound="1.3"' not in text
    assert any("connected to outbound v1.3 " in r.getMessage() for r in caplog.records)


async def test_a_version_configured_without_its_v_keeps_it_off(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(
        Bow(base_config())
        .middleware(version="1", create_criteria_from_listener_details=criteria_from_claim())
        .outbound(
            version="2",
            create_listener_details_from_token=JwtOutbound(secret=SECRET),
            middleware_version="v1",
        )
    )
    url = f"http://127.0.0.1:{bow.port}"
    listener = Listener(url)
    await listener.connect("v2")
    await listener.authenticate(token("USER/1"))
    text = await metrics(http, url)
    await listener.close()
    assert 'bow_sockets_authenticated{outbound="2",protocol="socketio"} 1.0' in text


async def test_an_unknown_version_is_refused_listing_the_versions_as_configured(
    start_bow: StartBow,
) -> None:
    bow = await start_bow(
        standard_bow().outbound(
            version="2",
            create_listener_details_from_token=JwtOutbound(secret=SECRET),
            middleware_version="1.1",
        )
    )
    refusals: list[object] = []
    listener = Listener(f"http://127.0.0.1:{bow.port}")
    listener.client.on("connect_error", refusals.append)
    with pytest.raises(socketio.exceptions.ConnectionError):
        await listener.connect("v9")
    assert refusals == [
        {
            "message": "unknown outbound version 'v9': this gateway serves 2, v1.3",
            "data": {"code": 4020, "reason": "unknown_version", "reconnect": "never"},
        }
    ], refusals


async def test_a_typo_in_a_middleware_version_is_reported_as_typed(tmp_path: Path) -> None:
    bow = build_bow(
        load_settings(jwt_config_file(tmp_path, SECRET, middleware_version="v9"), environ={})
    )
    with pytest.raises(ValueError) as raised:
        await bow.start()
    assert str(raised.value) == (
        "outbound 'v1' names middleware version 'v9', which is not registered (registered: v1)"
    )
