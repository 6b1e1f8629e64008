"""The README's client snippets work as written, against a real ``serve`` on the embedded default
(only its port changed): the Flywheel ``WebSocket`` and the ``EventSource`` in headless Chromium, on
a page of another origin listed in ``BOW_OUTBOUND_CORS_ORIGINS``, and the ``curl -N`` line in bash.
Each snippet is read from README.md, so that the README and these tests cannot drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from .support import SECRET, token
from .support import browser as chromium
from .support.browser import Browser
from .support.cli import Running, run_shell
from .support.cli_listen import push_at
from .support.served import BOW_GATEWAY, Served, clean_env, serve, wait_for_health

browser = chromium.browser  # the fixture, shared

README = Path(__file__).resolve().parent.parent / "README.md"
ADMIN = [{"role": "admin"}]
PAGE = """<!doctype html>
<meta charset="utf-8">
<title>the README's clients</title>
<script>
  window.state = { logged: [] };
  const show = (value) => (typeof value === "string" ? value : JSON.stringify(value));
  console.log = console.error = (...args) => state.logged.push(args.map(show).join(" "));
  const TOKEN = "{token}";
</script>
<script>{flywheel}</script>
<script>{sse}</script>
"""


def snippet(language: str, containing: str, port: int) -> str:
    """The README's one ``language`` block containing ``containing``, on ``port`` for 8080."""
    blocks = re.findall(rf"^ *```{language}\n(.*?)^ *```", README.read_text(), re.M | re.S)
    found = [block for block in blocks if containing in block]
    assert len(found) == 1, f"README.md has {len(found)} {language} blocks with {containing!r}"
    assert "127.0.0.1:8080" in found[0]
    return found[0].replace("127.0.0.1:8080", f"127.0.0.1:{port}")


@pytest.fixture
async def page_origin() -> AsyncIterator[tuple[str, dict[str, str]]]:
    """Another origin than the gateway's, serving the page set in the returned mapping."""
    page: dict[str, str] = {}

    async def handle(request: web.Request) -> web.Response:
        return web.Response(text=page["html"], content_type="text/html")

    app = web.Application()
    app.router.add_get("/", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", page
    finally:
        await runner.cleanup()


def gateway_env(origin: str) -> dict[str, str]:
    return {"BOW_JWT_SECRET": SECRET, "BOW_OUTBOUND_CORS_ORIGINS": origin}


@pytest.fixture
def gateway(tmp_path: Path, page_origin: tuple[str, dict[str, str]]) -> Iterator[Served]:
    origin, _ = page_origin
    with serve(tmp_path, **gateway_env(origin)) as served:
        yield served


@contextlib.contextmanager
def restarted(served: Served, folder: Path, **env: str) -> Iterator[Served]:
    """``served`` stopped gracefully (SIGTERM, exit 0), then ``serve`` again on its port."""
    assert served.stop() == 0
    stderr = folder / f"serve-{served.port}-again.stderr"
    with (
        open(stderr, "wb") as err,
        subprocess.Popen(
            [*BOW_GATEWAY, "serve", "--port", str(served.port)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=clean_env(**env),
        ) as process,
    ):
        again = Served(served.url, served.port, process, stderr)
        try:
            wait_for_health(served.url, process)
            yield again
        finally:
            again.stop()


async def stream_opened(served: Served, timeout: float = 10) -> None:
    """Wait until serve logs that an SSE stream was admitted."""
    async with asyncio.timeout(timeout):
        while not re.search(r"sse connection \S+ authenticated", served.new_stderr()):
            await asyncio.sleep(0.05)


@pytest.mark.browser
async def test_the_flywheel_and_event_source_snippets_receive_a_push(
    browser: Browser, page_origin: tuple[str, dict[str, str]], gateway: Served
) -> None:
    origin, page = page_origin
    page["html"] = (
        PAGE.replace("{token}", token("USER/1", ADMIN[0]))
        .replace("{flywheel}", snippet("js", "/broker?", gateway.port))
        .replace("{sse}", snippet("js", "new EventSource(", gateway.port))
    )
    gateway.new_stderr()
    await browser.open(origin)

    def bound(state: Any) -> bool:
        return any(line.startswith("B ") for line in state["logged"])

    state = await browser.state_when(bound, timeout=10)
    assert bound(state), state
    assert json.loads(state["logged"][0][2:])["errors"] == [], state
    await stream_opened(gateway)
    position = push_at(gateway, "greeting", ADMIN, text="hello")

    def received(state: Any) -> bool:
        return len(state["logged"]) >= 3

    logged = (await browser.state_when(received, timeout=10))["logged"]
    body = {"name": "greeting", "audience": ADMIN, "text": "hello"}
    frames = [line for line in logged if line.startswith("R ")]
    assert frames == ["R greeting " + json.dumps(body, separators=(",", ":"))], logged
    events = [line for line in logged if line.endswith(f" {position}")]
    assert events == [json.dumps(body, separators=(",", ":")) + f" {position}"], logged


@pytest.mark.browser
async def test_the_event_source_snippet_resumes_after_a_graceful_restart(
    browser: Browser, page_origin: tuple[str, dict[str, str]], gateway: Served, tmp_path: Path
) -> None:
    """A graceful stop alerts 4012 (advice: reconnect now): the snippet must not close on it."""
    origin, page = page_origin
    page["html"] = (
        PAGE.replace("{token}", token("USER/1", ADMIN[0]))
        .replace("{flywheel}", "")
        .replace("{sse}", snippet("js", "new EventSource(", gateway.port))
    )
    gateway.new_stderr()
    await browser.open(origin)

    def greetings(state: Any) -> list[int]:
        return [
            json.loads(line.split(" ")[0])["n"] for line in state["logged"] if "greeting" in line
        ]

    await stream_opened(gateway)
    push_at(gateway, "greeting", ADMIN, n=1)
    state = await browser.state_when(lambda state: greetings(state) == [1], timeout=10)
    assert greetings(state) == [1], state
    with restarted(gateway, tmp_path, **gateway_env(origin)) as again:
        await stream_opened(again, timeout=20)  # EventSource reconnected by itself
        for n in (2, 3):
            push_at(again, "greeting", ADMIN, n=n)
        state = await browser.state_when(lambda state: len(greetings(state)) == 3, timeout=10)
    assert greetings(state) == [1, 2, 3], state
    assert "alert 4012 shutdown" in state["logged"], state


async def test_the_curl_snippet_receives_a_push(gateway: Served) -> None:
    line = snippet("sh", "curl -N", gateway.port).strip()
    gateway.new_stderr()
    curl = await Running.start(
        "bash", "-c", "exec " + line, env=clean_env(TOKEN=token("USER/1", ADMIN[0]))
    )
    try:
        await stream_opened(gateway)
        position = push_at(gateway, "greeting", ADMIN, text="hello")
        event = [await curl.stdout_line() for _ in range(3)]
    finally:
        await curl.stop()
    assert event[:2] == [f"id: {position}\n", "event: greeting\n"]
    assert json.loads(event[2].removeprefix("data: "))["text"] == "hello"


@pytest.mark.browser
async def test_the_gobbler_snippets_replay_publish_and_read_the_history(
    browser: Browser, page_origin: tuple[str, dict[str, str]], gateway: Served
) -> None:
    origin, page = page_origin
    listener_token = token("USER/1", ADMIN[0])
    page["html"] = (
        PAGE.replace("{token}", listener_token)
        .replace("{flywheel}", snippet("js", "/gobbler?", gateway.port))
        .replace("{sse}", "")
    )
    await browser.open(origin)

    def subscribed(state: Any) -> bool:
        return any(line.startswith("#subscribed-to") for line in state["logged"])

    state = await browser.state_when(subscribed, timeout=10)
    assert [line.split()[0] for line in state["logged"][:4]] == [
        "#ok-connected",
        "#fetch-start",
        "#fetch-done",
        "#subscribed-to",
    ], state
    shell = snippet("sh", "X-Gobbler-Key", gateway.port).replace(
        "bow-gateway history", f"bow-gateway history --url {gateway.url}"
    )
    result = await run_shell(shell, TOKEN=listener_token)
    assert result.code == 0, result.err
    assert json.loads(result.out) == {"event": "/chat/room1", "data": "Hello", "sequence": 1}

    def received(state: Any) -> bool:
        return any(line.startswith("/chat/room1,") for line in state["logged"])

    logged = (await browser.state_when(received, timeout=10))["logged"]
    [message] = [line for line in logged if line.startswith("/chat/room1,")]
    head, headers, body = message.split("\n")
    assert head.split(",")[:5] == ["/chat/room1", "1", "marvin", "", "42"]
    assert (json.loads(headers), body) == ({"Key": "Value"}, "Hello")
