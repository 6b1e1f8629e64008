"""Shared fixtures: a real gateway on a free port, real HTTP, real python-socketio clients."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow

from .support import AUTH, MAX_HEADER, PATH, Gateway, Listener, base_config, standard_bow, token
from .support.mixed_clients import Mixed, mixed_bow
from .support.protocol2 import P2Gateway, p2_bow

# Every Python the tests start (`python -m bow_gateway` from the repository's root, say) imports
# the installed bow_gateway, not the tree's: the working directory is kept off its sys.path.
os.environ["PYTHONSAFEPATH"] = "1"


@pytest.fixture
async def start_bow() -> AsyncIterator[Callable[[Bow], Awaitable[Bow]]]:
    """Start any Bow; every one started is stopped at the end of the test."""
    started: list[Bow] = []

    async def start(bow: Bow) -> Bow:
        await bow.start()
        started.append(bow)
        return bow

    yield start
    for bow in started:
        await bow.stop()


@pytest.fixture
async def bow(start_bow: Callable[[Bow], Awaitable[Bow]]) -> Bow:
    return await start_bow(standard_bow())


@pytest.fixture
def url(bow: Bow) -> str:
    return f"http://127.0.0.1:{bow.port}"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    # A batch's Bow-Message-Ids is ~17 bytes a message: over aiohttp's 8,190 past ~480 messages
    async with aiohttp.ClientSession(max_field_size=MAX_HEADER) as session:
        yield session


@pytest.fixture
async def listeners(url: str) -> AsyncIterator[Callable[..., Awaitable[Listener]]]:
    """``await listeners("USER/1", {"role": "admin"})``: a connected, authenticated listener."""
    made: list[Listener] = []

    async def make(
        listener_id: str | None = None,
        criteria: dict[str, Any] | None = None,
        *,
        authenticate: bool = True,
        version: str | None = "v1.3",
        target: str | None = None,
        **connect: Any,
    ) -> Listener:
        listener = Listener(target or url)
        made.append(listener)
        await listener.connect(version, **connect)
        if authenticate and listener_id is not None:
            await listener.authenticate(token(listener_id, criteria))
        return listener

    yield make
    await asyncio.gather(*(listener.close() for listener in made))


@pytest.fixture
def push(http: aiohttp.ClientSession, url: str) -> Callable[..., Awaitable[aiohttp.ClientResponse]]:
    """``await push({"name": ..., "audience": [...]})``: POST a body to the inbound."""

    async def post(
        body: Any, *, path: str = PATH, headers: dict[str, str] | None = None
    ) -> aiohttp.ClientResponse:
        async with http.post(
            url + path, json=body, headers=AUTH if headers is None else headers
        ) as response:
            await response.read()
            return response

    return post


@pytest.fixture
async def serve(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> AsyncIterator[Callable[[Bow], Awaitable[Gateway]]]:
    """``gateway = await serve(some_bow)``: start it; its clients are closed before it stops."""
    gateways: list[Gateway] = []

    async def start(bow: Bow) -> Gateway:
        gateway = Gateway(await start_bow(bow), http)
        gateways.append(gateway)
        return gateway

    yield start
    for gateway in gateways:
        await gateway.close()


@pytest.fixture
async def serve_p2(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> AsyncIterator[Callable[..., Awaitable[P2Gateway]]]:
    """``gateway = await serve_p2(**config)``: :func:`~.support.protocol2.p2_bow` with
    ``config`` overriding top-level sections, its watcher connected; or
    ``serve_p2(bow=some_bow)``. Its clients are closed before it stops."""
    gateways: list[P2Gateway] = []

    async def start(bow: Bow | None = None, **config: Any) -> P2Gateway:
        started = await start_bow(bow or p2_bow(base_config(**config)))
        gateway = P2Gateway(Gateway(started, http))
        gateways.append(gateway)
        await gateway.watch()
        return gateway

    yield start
    for gateway in gateways:
        await gateway.close()


@pytest.fixture
async def serve_mixed(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> AsyncIterator[Callable[..., Awaitable[Mixed]]]:
    """``gateway = await serve_mixed(**config)``: :func:`~.support.mixed_clients.mixed_bow`
    (every protocol) with ``config`` overriding top-level sections; its clients are closed
    before it stops."""
    made: list[Mixed] = []

    async def start(**config: Any) -> Mixed:
        bow = await start_bow(mixed_bow(base_config(**config)))
        gateway = Mixed(f"instance {len(made)}", bow, http)
        made.append(gateway)
        return gateway

    yield start
    for gateway in made:
        await gateway.close()


@pytest.fixture
async def gateway(serve: Callable[[Bow], Awaitable[Gateway]]) -> Gateway:
    """The quick-start gateway: JWT outbound v1.3 (id from ``sub``), criteria from the token."""
    return await serve(standard_bow())
