"""``bow-gateway serve`` as a real process, its stderr a file (not a terminal): every line it writes
is one JSON object, python-engineio's, python-socketio's, aiohttp's and a plugin's warnings
included, and no odd request makes it write the same line twice."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import socketio

from .support import SECRET, token
from .support.served import BOW_GATEWAY, Served, clean_env, send_raw, serve

PASSWORD = "a-password-of-our-own"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"pusher:{PASSWORD}".encode()).decode()}
POLL = "/socket.io/?v=v1&EIO=4&transport=polling"
PIPE = asyncio.subprocess.PIPE

PASSTHROUGH = "bow_gateway.inbounds.passthrough:create_message_from_request_body"
CONFIG = f"""
port = 0
host = "127.0.0.1"
health_check = "noisy_plugin:health"
[inbound]
realm = "r"
username = "pusher"
password = "{PASSWORD}"
[outbound]
timeout = 1
[[middlewares]]
version = "v1"
create_criteria_from_listener_details = "bow_gateway.middlewares.claims:criteria_from_claim"
[[inbounds]]
path = "/v1/messages"
create_message_from_request_body = "{PASSTHROUGH}"
middleware_version = "v1"
[[outbounds]]
version = "v1"
create_listener_details_from_token = "bow_gateway.outbounds.jwt:JwtOutbound"
options = {{ secret_env = "BOW_JWT_SECRET" }}
middleware_version = "v1"
"""

# A plugin that warns through the warnings module, as libraries do: plain text on stderr unless
# serve sends warnings to its log.
PLUGIN = """
import warnings

def health(request):
    warnings.warn("noisy_plugin.health is deprecated", DeprecationWarning, stacklevel=1)
    warnings.warn("noisy_plugin says hello", UserWarning, stacklevel=1)
    return {"ok": True}
"""


async def polling_sid(http: aiohttp.ClientSession, url: str, version: str = "v1") -> str:
    """A new Engine.IO long-polling session's id."""
    async with http.get(f"{url}/socket.io/?v={version}&EIO=4&transport=polling") as response:
        text = await response.text()
    sid: str = json.loads(text[1:])["sid"]
    return sid


def odd_requests(
    served: Served, http: aiohttp.ClientSession
) -> dict[str, Callable[[], Awaitable[Any]]]:
    """What a careless or hostile client may send, each one a way into some library's logger."""
    url, port = served.url, served.port

    async def request(method: str, path: str, **kwargs: Any) -> None:
        async with http.request(method, url + path, **kwargs) as response:
            await response.read()

    async def get(path: str, **kwargs: Any) -> None:
        await request("GET", path, **kwargs)

    async def post(path: str, data: bytes | str, **kwargs: Any) -> None:
        await request("POST", path, data=data, **kwargs)

    async def bad_packet() -> None:
        sid = await polling_sid(http, url)
        await post(f"{POLL}&sid={sid}", "9nonsense")

    async def unknown_version() -> None:
        sid = await polling_sid(http, url, version="v9")
        await post(f"/socket.io/?v=v9&EIO=4&transport=polling&sid={sid}", "40")
        await get(f"/socket.io/?v=v9&EIO=4&transport=polling&sid={sid}")

    async def two_polls_at_once() -> None:
        sid = await polling_sid(http, url)
        await post(f"{POLL}&sid={sid}", "40")
        await get(f"{POLL}&sid={sid}")  # the namespace's connect answer
        await asyncio.gather(get(f"{POLL}&sid={sid}"), get(f"{POLL}&sid={sid}"))

    async def other_namespace() -> None:
        client = socketio.AsyncClient(reconnection=False)
        try:
            await client.connect(f"{url}?v=v1", namespaces=["/admin"], wait_timeout=2)
        except socketio.exceptions.ConnectionError:
            pass
        finally:
            await client.disconnect()

    async def refused_token() -> None:
        client = socketio.AsyncClient(reconnection=False)
        try:
            await client.connect(f"{url}?v=v1", transports=["websocket"], wait_timeout=2)
            await client.emit("authenticate", token("USER/1") + "x", callback=lambda *_: None)
            await asyncio.sleep(0.3)
        finally:
            await client.disconnect()

    async def binary_websocket_frame() -> None:
        async with http.ws_connect(url + "/socket.io/?v=v1&EIO=4&transport=websocket") as ws:
            await ws.receive()
            await ws.send_bytes(b"\x00\x01\x02")
            await ws.receive()

    async def health_plugin_warns() -> None:
        await get("/health")

    return {
        "unknown sid, GET": lambda: get(f"{POLL}&sid=bogus"),
        "unknown sid, GET again": lambda: get(f"{POLL}&sid=bogus2"),
        "unknown sid, POST": lambda: post(f"{POLL}&sid=bogus", "40"),
        "Engine.IO 3": lambda: get("/socket.io/?v=v1&EIO=3&transport=polling"),
        "bad transport": lambda: get("/socket.io/?v=v1&EIO=4&transport=carrier-pigeon"),
        "websocket upgrade, unknown sid": lambda: get(
            "/socket.io/?v=v1&EIO=4&transport=websocket&sid=bogus"
        ),
        "websocket transport without an upgrade": lambda: get(
            "/socket.io/?v=v1&EIO=4&transport=websocket"
        ),
        "JSONP": lambda: get(f"{POLL}&j=abc"),
        "PUT": lambda: request("PUT", POLL),
        "no query": lambda: get("/socket.io/"),
        "a packet no client sends": bad_packet,
        "unknown version": unknown_version,
        "two polls at once": two_polls_at_once,
        "another namespace": other_namespace,
        "a refused token": refused_token,
        "a binary websocket frame": binary_websocket_frame,
        "garbage HTTP": lambda: send_raw(port, b"GARBAGE\x01\r\n\r\n"),
        "a bad header": lambda: send_raw(
            port, b"GET /health HTTP/1.1\r\nHost: x\r\nBad\x00: y\r\n\r\n"
        ),
        "no credentials": lambda: post("/v1/messages", "{}"),
        "bad JSON": lambda: post(
            "/v1/messages", "{nope", headers={**AUTH, "Content-Type": "application/json"}
        ),
        "a health plugin that warns": health_plugin_warns,
        "a health plugin that warns, again": health_plugin_warns,
    }


def parse(text: str, what: str) -> list[dict[str, Any]]:
    """Each line of ``text`` as a JSON object with the log's fields; fails naming the line."""
    lines = []
    for line in text.splitlines():
        try:
            document = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"{what}: not a JSON line: {line!r}\n{text}") from None
        assert isinstance(document, dict), f"{what}: {line!r}"
        assert {"time", "level", "logger", "message"} <= document.keys(), f"{what}: {line!r}"
        lines.append(document)
    return lines


def repeated(lines: list[dict[str, Any]]) -> list[tuple[str, str]]:
    seen: set[tuple[str, str]] = set()
    twice = []
    for line in lines:
        key = (line["logger"], line["message"])
        if key in seen:
            twice.append(key)
        seen.add(key)
    return twice


@pytest.mark.slow
async def test_every_line_is_json_and_no_request_logs_a_line_twice(tmp_path: Path) -> None:
    (tmp_path / "noisy_plugin.py").write_text(PLUGIN)
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    everything: list[dict[str, Any]] = []
    with serve(tmp_path, "--config", str(config), BOW_JWT_SECRET=SECRET) as served:
        everything += parse(served.new_stderr(), "start")
        async with aiohttp.ClientSession() as http:
            for name, send in odd_requests(served, http).items():
                try:
                    await send()
                except (aiohttp.ClientError, ConnectionError):
                    pass  # some are answered by closing the connection
                await asyncio.sleep(0.3)
                lines = parse(served.new_stderr(), name)
                assert not repeated(lines), f"{name}: logged twice: {repeated(lines)}"
                everything += lines
            await asyncio.sleep(1.2)  # the unauthenticated connections' outbound.timeout
        assert served.stop() == 0
        everything += parse(served.new_stderr(), "stop")
    messages = [line["message"] for line in everything]
    # The odd requests did reach the libraries' loggers, the plugin's warnings the log,
    # and engineio's "Invalid session" came once for three unknown sids.
    assert sum("Invalid session" in message for message in messages) == 1, messages
    assert any(line["logger"] == "bow_gateway.engineio" for line in everything), messages
    assert any(line["logger"] == "bow_gateway.http.server" for line in everything), messages
    warned = [line for line in everything if line["logger"] == "py.warnings"]
    assert any("noisy_plugin says hello" in line["message"] for line in warned), messages
    assert sum("noisy_plugin says hello" in message for message in messages) == 1, messages
    assert any(message == "stopped" for message in messages), messages


async def test_a_failure_to_start_is_a_json_line_too(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    bad = tmp_path / "bad.toml"
    bad.write_text("port = 'eighty'\n")
    runs = {
        "a bad file": (["--config", str(bad)], 2, "port: Not a valid integer"),
        "a port taken": (["--port", str(port)], 1, f"cannot listen on 127.0.0.1:{port}"),
    }
    with taken:
        for what, (args, code, says) in runs.items():
            process = await asyncio.create_subprocess_exec(
                *BOW_GATEWAY, "serve", *args, stdout=PIPE, stderr=PIPE, env=clean_env()
            )
            _, err = await asyncio.wait_for(process.communicate(), 20)
            assert process.returncode == code, (what, err)
            lines = parse(err.decode(), what)
            assert lines[-1]["level"] == "error" and says in lines[-1]["message"], (what, lines)
