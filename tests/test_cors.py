"""outbound.cors_origins: which web pages may connect across origins, checked over real HTTP."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow
from bow_gateway.config import load_config
from bow_gateway.standalone import load_settings

from .support import AUTH, PATH, base_config, standard_bow

APP = "https://app.example.com"
EVIL = "https://evil.example.com"
SAME = "same origin"  # stands for the gateway's own origin, http://127.0.0.1:{port}

StartBow = Callable[[Bow], Awaitable[Bow]]


async def gateway(start_bow: StartBow, cors_origins: Any = None) -> Bow:
    outbound: dict[str, Any] = {"timeout": 5}
    if cors_origins is not None:
        outbound["cors_origins"] = cors_origins
    return await start_bow(standard_bow(base_config(outbound=outbound)))


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "loaded"),
    [
        (None, []),
        ([], []),
        ("*", ["*"]),
        (["*"], ["*"]),
        ([APP, "http://localhost:3000"], [APP, "http://localhost:3000"]),
        (["HTTPS://App.Example.com "], [APP]),
        (["capacitor://localhost"], ["capacitor://localhost"]),
    ],
)
def test_cors_origins_are_loaded_as_a_list(value: Any, loaded: list[str]) -> None:
    outbound: dict[str, Any] = {"timeout": 5}
    if value is not None:
        outbound["cors_origins"] = value
    assert load_config(base_config(outbound=outbound)).cors_origins == loaded


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (APP, 'must be "*" or a list of origins'),
        ([APP + "/"], "'https://app.example.com/' is not an origin"),
        (["app.example.com"], "is not an origin"),
        (["null"], "is not an origin"),
        (["*", APP], '"*" allows every origin: give it alone'),
        ([1], 'must be "*" or a list of origins'),
    ],
)
def test_bad_cors_origins_are_refused_with_the_field_named(value: Any, error: str) -> None:
    with pytest.raises(ValueError) as raised:
        load_config(base_config(outbound={"timeout": 5, "cors_origins": value}))
    assert "outbound.cors_origins" in str(raised.value) and error in str(raised.value)


@pytest.mark.parametrize(
    ("variable", "loaded"),
    [
        (f"{APP},http://localhost:3000", [APP, "http://localhost:3000"]),
        (f"{APP}, http://localhost:3000", [APP, "http://localhost:3000"]),
        ("*", ["*"]),
        ("", []),  # an empty variable counts as unset
    ],
)
def test_bow_outbound_cors_origins_is_a_comma_separated_list(
    variable: str, loaded: list[str]
) -> None:
    settings = load_settings(None, environ={"BOW_OUTBOUND_CORS_ORIGINS": variable})
    assert load_config(settings.config).cors_origins == loaded
    if variable:
        assert settings.environment == {"outbound.cors_origins": "BOW_OUTBOUND_CORS_ORIGINS"}


# -- over HTTP: a long-polling handshake and a websocket handshake with an Origin header --------

CASES = [
    # (outbound.cors_origins, the request's Origin or None, allowed)
    (None, EVIL, False),
    (None, SAME, True),
    (None, None, True),
    ([APP], APP, True),
    ([APP], EVIL, False),
    ([APP], SAME, False),
    ([APP], None, True),
    ("*", EVIL, True),
    ("*", None, True),
]


@pytest.mark.parametrize(("cors_origins", "origin", "allowed"), CASES)
async def test_long_polling_handshake_checks_the_origin(
    start_bow: StartBow,
    http: aiohttp.ClientSession,
    cors_origins: Any,
    origin: str | None,
    allowed: bool,
) -> None:
    bow = await gateway(start_bow, cors_origins)
    url = f"http://127.0.0.1:{bow.port}"
    origin = url if origin == SAME else origin
    headers = {} if origin is None else {"Origin": origin}
    async with http.get(
        url + "/socket.io/?EIO=4&transport=polling&v=v1.3", headers=headers
    ) as response:
        body = await response.text()
    if not allowed:
        assert response.status == 400
        assert f"{origin} is not an accepted origin" in body
        assert "Access-Control-Allow-Origin" not in response.headers
        return
    assert response.status == 200, body
    assert body.startswith("0{")  # the Engine.IO open packet
    if origin is None:
        assert "Access-Control-Allow-Origin" not in response.headers
    else:
        assert response.headers["Access-Control-Allow-Origin"] == origin
    # Cookies only for origins named one by one: with "*", any site would get them.
    credentials = response.headers.get("Access-Control-Allow-Credentials")
    assert credentials == (None if cors_origins == "*" else "true")


@pytest.mark.parametrize(("cors_origins", "origin", "allowed"), CASES)
async def test_websocket_handshake_checks_the_origin(
    start_bow: StartBow,
    http: aiohttp.ClientSession,
    cors_origins: Any,
    origin: str | None,
    allowed: bool,
) -> None:
    bow = await gateway(start_bow, cors_origins)
    origin = f"http://127.0.0.1:{bow.port}" if origin == SAME else origin
    url = f"ws://127.0.0.1:{bow.port}/socket.io/?EIO=4&transport=websocket&v=v1.3"
    if not allowed:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(url, origin=origin)
        assert refused.value.status == 400
        return
    async with http.ws_connect(url, origin=origin) as websocket:
        opened = await websocket.receive_str(timeout=5)
    assert opened.startswith("0{")


async def test_an_upgrade_to_websocket_checks_the_origin_too(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    bow = await gateway(start_bow, [APP])
    url = f"127.0.0.1:{bow.port}/socket.io/?EIO=4&v=v1.3"
    async with http.get(f"http://{url}&transport=polling", headers={"Origin": APP}) as response:
        sid = json.loads((await response.text())[1:])["sid"]  # the open packet: "0{...}"
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(f"ws://{url}&transport=websocket&sid={sid}", origin=EVIL)
    assert refused.value.status == 400


async def test_other_endpoints_send_no_cors_headers(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    """Only /socket.io/ serves browsers: "*" opens it alone, never /health or an inbound."""
    bow = await gateway(start_bow, "*")
    url = f"http://127.0.0.1:{bow.port}"
    async with http.get(url + "/health", headers={"Origin": EVIL}) as response:
        assert response.status == 200
        assert "Access-Control-Allow-Origin" not in response.headers
    body = {"name": "greeting", "audience": [{"role": "admin"}]}
    async with http.post(url + PATH, json=body, headers={**AUTH, "Origin": EVIL}) as response:
        assert response.status == 204
        assert "Access-Control-Allow-Origin" not in response.headers
