"""Helpers shared by the tests: the quick-start gateway, tokens, a recording listener, polling."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import socketio
from bow_gateway.inbounds.passthrough import create_message_from_request_body
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound, mint

from bow_gateway import Bow

SECRET = "a-test-secret-that-is-at-least-32-bytes-long"
USER, PASSWORD, REALM = "pusher", "s3cret-pusher", "Test platform"
PATH = "/v1.2/messages"
AUTH = {"Authorization": aiohttp.encode_basic_auth(USER, PASSWORD)}


def token(listener_id: str, criteria: dict[str, Any] | None = None, **kwargs: Any) -> str:
    return mint(listener_id, SECRET, criteria=criteria or {}, **kwargs)


def base_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "port": 0,
        "host": "127.0.0.1",
        "inbound": {"realm": REALM, "username": USER, "password": PASSWORD},
        "outbound": {"timeout": 5},
        "middleware": {"log_interval": None},
    }
    config.update(overrides)
    return config


def standard_bow(config: dict[str, Any] | None = None) -> Bow:
    """The quick-start gateway: JWT outbound v1.3, claims middleware v1.1, pass-through inbound."""
    return (
        Bow(config or base_config())
        .middleware(version="v1.1", create_criteria_from_listener_details=criteria_from_claim())
        .inbound(
            path=PATH,
            create_message_from_request_body=create_message_from_request_body,
            middleware_version="v1.1",
        )
        .outbound(
            version="v1.3",
            create_listener_details_from_token=JwtOutbound(secret=SECRET),
            middleware_version="v1.1",
        )
    )


class Listener:
    """A real python-socketio client that records every event it receives."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = socketio.AsyncClient(reconnection=False)
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.alerts: list[Any] = []
        self.disconnected = asyncio.Event()
        self.client.on("*", self._on_any)
        self.client.on("disconnect", self._on_disconnect)

    async def _on_any(self, event: str, *data: Any) -> None:
        if event == "alert":
            self.alerts.append(data[0] if data else None)
        self.events.put_nowait((event, data[0] if data else _NO_DATA))

    async def _on_disconnect(self, *args: Any) -> None:
        self.disconnected.set()

    async def connect(self, version: str | None = "v1.3", **kwargs: Any) -> None:
        url = self.url if version is None else f"{self.url}?v={version}"
        kwargs.setdefault("transports", ["websocket"])
        await self.client.connect(url, wait_timeout=5, **kwargs)

    async def authenticate(self, listener_token: Any) -> Any:
        return await self.client.call("authenticate", listener_token, timeout=5)

    async def next_event(self, timeout: float = 5.0) -> tuple[str, Any]:
        return await asyncio.wait_for(self.events.get(), timeout)

    async def no_event(self, within: float = 0.3) -> None:
        await asyncio.sleep(within)
        assert self.events.empty(), f"unexpected event {self.events.get_nowait()!r}"

    async def close(self) -> None:
        if self.client.connected:
            await self.client.disconnect()


class _NoData:
    def __repr__(self) -> str:
        return "<no data>"


_NO_DATA = _NoData()
NO_DATA: Any = _NO_DATA


async def read_metric(http: aiohttp.ClientSession, url: str, sample: str) -> float:
    """The value of one sample of ``GET /metrics`` (``0.0`` when absent)."""
    async with http.get(url + "/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith(sample + " "):
                return float(line.split()[-1])
    return 0.0


def short_heartbeats(bow: Bow) -> None:
    """Engine.IO pings every second, answered within one (the default is 25 s and 20 s)."""
    eio = bow._outbound.sio.eio  # type: ignore[union-attr]
    eio.ping_interval, eio.ping_timeout = 1, 1


async def until(
    condition: Callable[[], object], what: str = "a condition", *, timeout: float = 5.0
) -> None:
    """Poll ``condition`` every 10 ms until it holds; after ``timeout`` s, fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}")
        await asyncio.sleep(0.01)
