"""Structured logs: one JSON object per line off a terminal, and never a secret in a line."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from bow_gateway.runtime.logs import configure_logging

from .support import AUTH, PASSWORD, PATH, SECRET, Listener, token

Push = Callable[..., Awaitable[aiohttp.ClientResponse]]


def test_off_a_terminal_each_line_is_a_json_object() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging(stream=stream, worker=3)
        logging.getLogger("bow_gateway.test").info("socket %s connected", "abc")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    line = json.loads(stream.getvalue().splitlines()[-1])
    assert line["message"] == "socket abc connected"
    assert line["level"] == "info"
    assert line["logger"] == "bow_gateway.test"
    assert line["worker"] == 3
    assert line["time"].endswith("Z")


async def test_connection_lifecycle_and_refusals_are_logged_without_secrets(
    caplog: pytest.LogCaptureFixture,
    push: Push,
    listeners: Callable[..., Awaitable[Listener]],
    http: aiohttp.ClientSession,
    url: str,
) -> None:
    caplog.set_level(logging.INFO, logger="bow_gateway")
    good = token("USER/1", {"role": "admin"})
    await listeners("USER/1", {"role": "admin"})
    refused = await listeners(None)
    forged = token("USER/2") + "x"
    await refused.client.emit("authenticate", forged, callback=lambda *a: None)
    await refused.disconnected.wait()
    assert (await push({"name": "N", "audience": [{}]})).status == 422
    async with http.post(url + PATH, json={}, headers={"Authorization": "Basic eDp5"}):
        pass
    messages = [record.getMessage() for record in caplog.records]
    text = "\n".join(messages)
    assert any("connected to outbound v1.3" in m for m in messages)
    assert any("authenticated as listener 'USER/1'" in m for m in messages)
    assert any("closing socket" in m and "invalid token" in m for m in messages)
    assert any("refused POST /v1.2/messages" in m and "422" in m for m in messages)
    assert any("wrong credentials" in m for m in messages)
    for secret in (good, forged, PASSWORD, SECRET, AUTH["Authorization"].split()[1]):
        assert secret not in text


@pytest.mark.parametrize(
    ("query", "namespace", "reason"),
    [
        ("", "/", "no outbound version"),
        ("?v=v9", "/", "unknown outbound version 'v9'"),
        ("?v=v1.3", "/admin", "unknown namespace '/admin'"),
    ],
)
async def test_a_connect_refused_is_logged_with_its_reason(
    caplog: pytest.LogCaptureFixture, url: str, query: str, namespace: str, reason: str
) -> None:
    # Regression: a Socket.IO connect refused at the handshake wrote no line at all.
    import socketio

    caplog.set_level(logging.INFO, logger="bow_gateway")
    client = socketio.AsyncClient(reconnection=False)
    with pytest.raises(socketio.exceptions.ConnectionError):
        await client.connect(
            url + query, transports=["websocket"], namespaces=[namespace], wait_timeout=5
        )
    await client.disconnect()
    assert any(
        "refusing socket" in record.getMessage() and reason in record.getMessage()
        for record in caplog.records
    ), [record.getMessage() for record in caplog.records]
