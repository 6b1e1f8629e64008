"""outbound.cors_origins: which web pages may connect across origins, checked over real HTTP and
in a real browser (headless Chromium driven by chromedriver over W3C WebDriver)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
from aiohttp import web

from bow_gateway import Bow
from bow_gateway.app.standalone import load_settings
from bow_gateway.runtime.config import load_config

from .support import AUTH, PATH, base_config, token
from .support import browser as chromium
from .support.browser import Browser, StartBow, gateway

browser = chromium.browser  # the fixture, shared

APP = "https://app.example.com"
EVIL = "https://evil.example.com"
SAME = "same origin"  # stands for the gateway's own origin, http://127.0.0.1:{port}
BROWSER_FILES = Path(__file__).parent / "browser"


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


# The plain-WebSocket endpoints follow Socket.IO's rule, but refuse with 403 and say why.
PLAIN_WEBSOCKETS = ["/broker", "/gobbler"]


async def plain_websocket_opens(websocket: aiohttp.ClientWebSocketResponse, path: str) -> None:
    """Assert the connection works: a Flywheel bind is answered, Gobbler says it is connected."""
    if path == "/broker":
        bind = {"auth": {"type": "Bearer", "token": token("USER/1")}, "subscribe": ["#"]}
        await websocket.send_str("B " + json.dumps(bind))
        answer = await websocket.receive_str(timeout=5)
        assert answer.startswith("B ") and json.loads(answer[2:])["errors"] == [], answer
    else:
        assert (await websocket.receive_str(timeout=5)).startswith("#ok-connected")


@pytest.mark.parametrize("path", PLAIN_WEBSOCKETS)
@pytest.mark.parametrize(("cors_origins", "origin", "allowed"), CASES)
async def test_plain_websocket_handshake_checks_the_origin(
    start_bow: StartBow,
    http: aiohttp.ClientSession,
    path: str,
    cors_origins: Any,
    origin: str | None,
    allowed: bool,
) -> None:
    bow = await gateway(start_bow, cors_origins)
    origin = f"http://127.0.0.1:{bow.port}" if origin == SAME else origin
    url = f"ws://127.0.0.1:{bow.port}{path}?v=v1.3&token={token('USER/1')}"
    if not allowed:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(url, origin=origin)
        assert refused.value.status == 403
        assert bow._outbound is not None and bow._outbound.open_connections == 0
        return
    async with http.ws_connect(url, origin=origin) as websocket:
        await plain_websocket_opens(websocket, path)


@pytest.mark.parametrize("path", PLAIN_WEBSOCKETS)
async def test_a_refused_origin_is_told_in_the_answer(
    start_bow: StartBow, http: aiohttp.ClientSession, path: str
) -> None:
    bow = await gateway(start_bow, [APP])
    async with http.get(
        f"http://127.0.0.1:{bow.port}{path}?v=v1.3", headers={"Origin": EVIL}
    ) as response:
        assert response.status == 403
        answer = await response.json()
    assert answer["reason"] == "bad_request"
    assert answer["text"] == f"origin {EVIL} is not allowed (outbound.cors_origins)"


@pytest.mark.parametrize("path", PLAIN_WEBSOCKETS)
async def test_the_gateways_own_origin_behind_a_proxy_may_connect(
    start_bow: StartBow, http: aiohttp.ClientSession, path: str
) -> None:
    """As Socket.IO's: the origin a proxy forwarded (X-Forwarded-Proto, -Host) is its own."""
    bow = await gateway(start_bow)
    url = f"ws://127.0.0.1:{bow.port}{path}?v=v1.3&token={token('USER/1')}"
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "push.example.com"}
    async with http.ws_connect(
        url, origin="https://push.example.com", headers=forwarded
    ) as websocket:
        await plain_websocket_opens(websocket, path)
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(url, origin="https://push.example.com")
    assert refused.value.status == 403


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


# -- in a real browser: a page served from another origin, with the official client ------------

PAGE = """<!doctype html>
<meta charset="utf-8">
<title>bow_gateway cross-origin test</title>
<script src="/socket.io.min.js"></script>
<script>
  const params = new URLSearchParams(location.search);
  const state = (window.state = { connected: false, authenticated: false, errors: [], events: [] });
  const socket = (window.socket = io(params.get("gateway"), {
    query: { v: "v1.3" },
    transports: params.get("transports").split(","),
    reconnection: false,
  }));
  socket
    .on("connect_error", (error) => state.errors.push(error.message))
    .on("alert", (reason) => state.errors.push("alert: " + reason))
    .on("greeting", (data) => state.events.push(data))
    .on("connect", () => {
      state.connected = true;
      socket.emit("authenticate", params.get("token"), () => (state.authenticated = true));
    });
</script>
"""

PLAIN_PAGE = """<!doctype html>
<meta charset="utf-8">
<title>bow_gateway cross-origin test: a plain WebSocket</title>
<script>
  const params = new URLSearchParams(location.search);
  const state = (window.state = { opened: false, closed: null, errors: [], frames: [] });
  const ws = new WebSocket(params.get("url"));
  ws.onopen = () => {
    state.opened = true;
    if (params.get("bind")) ws.send("B " + params.get("bind"));
  };
  ws.onerror = () => state.errors.push("websocket error");
  ws.onmessage = (e) => state.frames.push(e.data);
  ws.onclose = (e) => (state.closed = e.code);
</script>
"""


@pytest.fixture
async def page_origin() -> AsyncIterator[str]:
    """A second web server, another origin than the gateway's: the pages (Socket.IO's at ``/``,
    a plain WebSocket's at ``/plain``) and the client bundle.

    ``socket.io.min.js`` is socket.io-client's browser bundle, vendored (tests/browser/README.md).
    """
    bundle = BROWSER_FILES / "socket.io.min.js"
    assert bundle.is_file(), f"{bundle} is missing: see tests/browser/README.md"

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def script(request: web.Request) -> web.Response:
        return web.Response(body=bundle.read_bytes(), content_type="application/javascript")

    async def plain(request: web.Request) -> web.Response:
        return web.Response(text=PLAIN_PAGE, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/plain", plain)
    app.router.add_get("/socket.io.min.js", script)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def page_url(origin: str, bow: Bow, transports: str, listener_token: str) -> str:
    query = {
        "gateway": f"http://127.0.0.1:{bow.port}",
        "transports": transports,
        "token": listener_token,
    }
    return f"{origin}/?{urlencode(query)}"


@pytest.mark.browser
async def test_a_browser_page_of_another_origin_is_refused_by_default(
    browser: Browser, page_origin: str, start_bow: StartBow
) -> None:
    bow = await gateway(start_bow)
    for transports in ("polling", "websocket"):
        await browser.open(page_url(page_origin, bow, transports, token("USER/1")))
        state = await browser.state_when(lambda state: state["errors"] or state["connected"])
        assert state["errors"] and not state["connected"], (transports, state)
    assert bow._outbound is not None and bow._outbound.connects == 0


@pytest.mark.browser
async def test_a_browser_page_of_a_listed_origin_receives_pushes(
    browser: Browser, page_origin: str, start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    bow = await gateway(start_bow, [page_origin])
    for number, transports in enumerate(["polling", "websocket", "polling,websocket"]):
        listener = f"USER/{number}"
        await browser.open(page_url(page_origin, bow, transports, token(listener)))
        # With both transports, the client starts polling, then upgrades to a websocket.
        expected = transports.split(",")[-1]

        def ready(state: Any, expected: str = expected) -> bool:
            return bool(state["errors"]) or (
                state["authenticated"] and state["transport"] == expected
            )

        state = await browser.state_when(ready)
        assert state["authenticated"] and not state["errors"], (transports, state)
        assert state["transport"] == expected
        message = {"name": "greeting", "audience": [{"__id": listener}], "text": transports}
        async with http.post(
            f"http://127.0.0.1:{bow.port}{PATH}", json=message, headers=AUTH
        ) as response:
            assert response.status == 204
        state = await browser.state_when(lambda state: state["events"])
        assert state["events"] == [message], transports


def plain_page_url(origin: str, bow: Bow, path: str) -> str:
    """The plain page, opening ``path`` (Flywheel: then binding) as listener USER/1."""
    listener_token = token("USER/1")
    query = {"url": f"ws://127.0.0.1:{bow.port}{path}?v=v1.3&token={listener_token}"}
    if path == "/broker":
        query["bind"] = json.dumps({"auth": {"type": "Bearer", "token": listener_token}})
    return f"{origin}/plain?{urlencode(query)}"


@pytest.mark.browser
async def test_a_browser_page_of_another_origin_cannot_open_a_plain_websocket_by_default(
    browser: Browser, page_origin: str, start_bow: StartBow
) -> None:
    bow = await gateway(start_bow)
    for path in PLAIN_WEBSOCKETS:
        await browser.open(plain_page_url(page_origin, bow, path))
        state = await browser.state_when(lambda state: state["closed"] is not None)
        assert not state["opened"] and state["errors"] and state["closed"] == 1006, (path, state)
    assert bow._outbound is not None and bow._outbound.open_connections == 0


@pytest.mark.browser
async def test_a_browser_page_of_a_listed_origin_opens_a_plain_websocket(
    browser: Browser, page_origin: str, start_bow: StartBow
) -> None:
    bow = await gateway(start_bow, [page_origin])
    for path, first in (("/broker", "B "), ("/gobbler", "#ok-connected")):
        await browser.open(plain_page_url(page_origin, bow, path))
        state = await browser.state_when(lambda state: state["frames"] or state["closed"])
        assert state["opened"] and not state["errors"], (path, state)
        assert state["frames"][0].startswith(first), (path, state)
        if path == "/broker":
            assert json.loads(state["frames"][0][2:])["errors"] == [], state
