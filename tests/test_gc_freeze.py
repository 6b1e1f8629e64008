"""Freezing long-lived objects out of the cyclic garbage collector's full collections."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from bow_gateway import Bow
from bow_gateway.runtime.gc_freeze import freeze_after_connects, release_closed_transports

from .support import Listener, base_config, standard_bow, token, until

StartBow = Callable[[Bow], Awaitable[Bow]]


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    """The permanent generation is process-wide: every test starts and ends with it empty."""
    gc.unfreeze()
    yield
    gc.unfreeze()


@contextlib.asynccontextmanager
async def freezer(connects: Callable[[], int]) -> AsyncIterator[None]:
    """``freeze_after_connects`` running, without CPython's own collections (which freeze too)."""
    gc.disable()
    task = asyncio.create_task(freeze_after_connects(connects, interval=0.01))
    try:
        yield
    finally:
        gc.enable()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_freezes_at_start_then_only_after_new_connections() -> None:
    connects = 0
    async with freezer(lambda: connects):
        await until(lambda: gc.get_freeze_count() > 0)  # at start
        gc.unfreeze()
        await asyncio.sleep(0.1)
        assert gc.get_freeze_count() == 0  # nothing connected since
        connects += 1
        await until(lambda: gc.get_freeze_count() > 0)


async def test_a_gateway_with_gc_freeze_freezes_its_connections(start_bow: StartBow) -> None:
    bow = await start_bow(standard_bow(base_config(gc_freeze=True)))
    await until(lambda: gc.get_freeze_count() > 0)
    gc.unfreeze()
    listener = Listener(f"http://127.0.0.1:{bow.port}")
    try:
        await listener.connect()
        await listener.authenticate(token("frozen"))
        await until(lambda: gc.get_freeze_count() > 0)
    finally:
        await listener.close()


async def test_an_embedded_gateway_freezes_nothing(start_bow: StartBow) -> None:
    bow = await start_bow(standard_bow())
    listener = Listener(f"http://127.0.0.1:{bow.port}")
    try:
        await listener.connect()
        await listener.authenticate(token("embedded"))
        await asyncio.sleep(1.2)  # past the freezer's interval, had it run
        assert gc.get_freeze_count() == 0
    finally:
        await listener.close()


async def test_a_running_gateway_collects_the_youngest_generation_less_often() -> None:
    before = gc.get_threshold()
    bow = standard_bow()
    await bow.start()
    try:
        assert gc.get_threshold() == (10_000, *before[1:])
    finally:
        await bow.stop()
    assert gc.get_threshold() == before  # put back once the gateway stops


async def test_the_young_threshold_is_put_back_when_the_last_of_two_gateways_stops() -> None:
    before = gc.get_threshold()
    first, second = standard_bow(), standard_bow()
    await first.start()
    await second.start()
    await first.stop()
    assert gc.get_threshold()[0] == 10_000  # the second still runs
    await second.stop()
    assert gc.get_threshold() == before


async def test_a_higher_young_threshold_of_the_program_is_kept() -> None:
    before = gc.get_threshold()
    gc.set_threshold(50_000, *before[1:])
    try:
        bow = standard_bow()
        await bow.start()
        assert gc.get_threshold()[0] == 50_000
        await bow.stop()
        assert gc.get_threshold()[0] == 50_000
    finally:
        gc.set_threshold(*before)


async def test_what_survives_a_full_collection_is_frozen() -> None:
    async with freezer(lambda: 0):
        await until(lambda: gc.get_freeze_count() > 0)  # at start
        gc.unfreeze()
        await asyncio.sleep(0.05)
        assert gc.get_freeze_count() == 0
        gc.collect()  # as CPython does once enough objects survived
        await until(lambda: gc.get_freeze_count() > 0)
    assert not any(
        getattr(callback, "__qualname__", "").startswith("freeze_after_connects")
        for callback in gc.callbacks
    )


async def test_a_closed_connection_s_transport_is_freed_by_reference_counting() -> None:
    # Regression: on CPython 3.11 a closed socket transport kept a reference to itself (its read
    # callback, gh-100348), so every connection frozen while open was kept forever once closed.
    release_closed_transports()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    gc.disable()
    try:
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        gone = weakref.ref(transport)
        transport.close()
        del transport
        await asyncio.sleep(0.05)  # connection_lost runs on the next iterations
        assert gone() is None
    finally:
        gc.enable()
        server.close()
        await server.wait_closed()
