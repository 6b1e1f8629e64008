"""Headless Chromium driven over W3C WebDriver (chromedriver), for the tests a browser drives,
and the gateway they open pages against."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow

from . import base_config, standard_bow
from .redis_server import free_port

StartBow = Callable[[Bow], Awaitable[Bow]]


async def gateway(start_bow: StartBow, cors_origins: Any = None) -> Bow:
    outbound: dict[str, Any] = {"timeout": 5}
    if cors_origins is not None:
        outbound["cors_origins"] = cors_origins
    return await start_bow(standard_bow(base_config(outbound=outbound)))


STATE = """const engine = window.socket && window.socket.io.engine;
return { ...window.state, transport: engine && engine.transport && engine.transport.name };"""


CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    # Without these, Chromium reaches for Google's servers, which a closed network refuses.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


class Browser:
    """One headless Chromium session, spoken to in W3C WebDriver's JSON over HTTP."""

    def __init__(self, http: aiohttp.ClientSession, session: str) -> None:
        self._http = http
        self._session = f"/session/{session}"

    async def command(self, method: str, path: str, body: Any = None) -> Any:
        async with self._http.request(method, self._session + path, json=body) as response:
            answer = await response.json()
        if response.status != 200:
            raise AssertionError(f"WebDriver {method} {path}: {answer['value']}")
        return answer["value"]

    async def open(self, url: str) -> None:
        await self.command("POST", "/url", {"url": url})

    async def state_when(self, done: Callable[[Any], bool], timeout: float = 5.0) -> Any:
        """``window.state``, polled until ``done(state)`` or until ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            state = await self.command("POST", "/execute/sync", {"script": STATE, "args": []})
            if done(state) or time.monotonic() > deadline:
                return state
            await asyncio.sleep(0.05)


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.fail(
            "this test needs Debian's chromium and chromium-driver: run "
            "`sh tests/install-system-packages.sh` as root (or `sudo apt-get install chromium "
            "chromium-driver`)"
        )
    port = free_port()
    driver = subprocess.Popen(
        [chromedriver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            await _until_ready(http, driver)
            capabilities = {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": [*CHROMIUM_ARGS, f"--user-data-dir={tmp_path / 'chromium'}"],
                },
            }
            async with http.post(
                "/session", json={"capabilities": {"alwaysMatch": capabilities}}
            ) as response:
                answer = await response.json()
            assert response.status == 200, f"chromedriver cannot start Chromium: {answer}"
            session = answer["value"]["sessionId"]
            try:
                yield Browser(http, session)
            finally:
                async with http.delete(f"/session/{session}") as response:
                    await response.read()
    finally:
        driver.terminate()
        driver.wait(timeout=10)


async def _until_ready(http: aiohttp.ClientSession, driver: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert driver.poll() is None, f"chromedriver exited with status {driver.returncode}"
        try:
            async with http.get("/status") as response:
                if (await response.json())["value"]["ready"]:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError("chromedriver did not answer /status within 10 s")
