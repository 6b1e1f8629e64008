"""The SSE stream in a real browser: headless Chromium's ``EventSource`` on a page of another
origin (the style of tests/test_cors.py, the WebDriver session of tests/support/browser.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
from aiohttp import web

from bow_gateway import Bow

from .support import AUTH, PATH, token
from .support import browser as chromium
from .support.browser import Browser, StartBow, gateway

pytestmark = pytest.mark.browser

browser = chromium.browser  # the fixture, shared

PAGE = """<!doctype html>
<meta charset="utf-8">
<title>bow_gateway EventSource test</title>
<script>
  const params = new URLSearchParams(location.search);
  const state = (window.state = { opened: 0, errors: 0, events: [], alerts: [] });
  const source = new EventSource(params.get("url"));
  source.onopen = () => state.opened++;
  source.onerror = () => state.errors++;
  source.addEventListener("greeting", (e) =>
    state.events.push([e.lastEventId, JSON.parse(e.data).n]));
  source.addEventListener("alert", (e) => state.alerts.push(JSON.parse(e.data).reason));
</script>
"""


@pytest.fixture
async def sse_page_origin() -> AsyncIterator[str]:
    """Another origin than the gateway's, serving :data:`PAGE`."""

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def page_url(origin: str, bow: Bow, listener_token: str) -> str:
    stream = f"http://127.0.0.1:{bow.port}/events?" + urlencode({"token": listener_token})
    return f"{origin}/?{urlencode({'url': stream})}"


async def push(http: aiohttp.ClientSession, bow: Bow, listener: str, n: int) -> str:
    message = {"name": "greeting", "audience": [{"__id": listener}], "n": n}
    async with http.post(f"http://127.0.0.1:{bow.port}{PATH}", json=message, headers=AUTH) as r:
        assert r.status == 204
        return r.headers["Bow-Position"]


async def test_an_event_source_of_another_origin_is_refused_by_default(
    browser: Browser, sse_page_origin: str, start_bow: StartBow
) -> None:
    bow = await gateway(start_bow)
    await browser.open(page_url(sse_page_origin, bow, token("USER/1")))
    state = await browser.state_when(lambda state: state["errors"] or state["opened"])
    assert state["errors"] and not state["opened"], state


async def test_an_event_source_of_a_listed_origin_receives_and_recovers(
    browser: Browser, sse_page_origin: str, start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    bow = await gateway(start_bow, [sse_page_origin])
    await browser.open(page_url(sse_page_origin, bow, token("USER/1")))
    state = await browser.state_when(lambda state: state["errors"] or state["opened"])
    assert state["opened"] == 1 and not state["errors"], state
    first = await push(http, bow, "USER/1", 1)
    state = await browser.state_when(lambda state: state["events"])
    assert state["events"] == [[first, 1]]
    # The server ends the stream (a kick): the browser reconnects by itself with Last-Event-ID
    await bow.disconnect(["USER/1"], "bye", "now")
    state = await browser.state_when(lambda state: state["errors"])
    assert state["alerts"] == ["kicked"] and state["errors"] == 1
    missed = [await push(http, bow, "USER/1", n) for n in (2, 3)]

    def recovered(state: Any) -> bool:
        return len(state["events"]) >= 3

    state = await browser.state_when(recovered, timeout=10)
    assert state["opened"] == 2
    assert state["events"] == [[first, 1], [missed[0], 2], [missed[1], 3]]
