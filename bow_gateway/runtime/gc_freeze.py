"""Keep the cyclic garbage collector off the hot path: its youngest generation collected less
often while a gateway runs, and long-lived objects kept out of its full collections with
``gc.freeze()``.

At 10,000 sockets a gateway holds about a million objects that the cyclic collector tracks, and
a full collection walks every one of them: the event loop stalls for a second. Connections live
for minutes or hours, so once they are open their objects are moved to the permanent generation,
which collections skip. A closed connection's objects are still freed, by reference counting
(the outbound leaves no reference cycle behind: ``tests/test_seams_transport.py`` checks it).

Freezing is process-wide, so it is off unless the gateway owns its process (the ``gc_freeze``
setting; ``bow-gateway serve`` turns it on). The young threshold is process-wide too, but only
moves when collections run, never what they collect: every running gateway raises it.
"""

from __future__ import annotations

import asyncio
import gc
import sys
from asyncio import selector_events
from collections.abc import Callable
from typing import Any

_freezing = False  # a collection of ours: not one to freeze after
_young: list[tuple[int, int, int]] = []  # per running gateway, the threshold it found


def raise_young_threshold(young_threshold: int = 10_000) -> None:
    """Collect the youngest generation once ``young_threshold`` more objects are alive than at
    the last collection, rather than CPython's 700, until :func:`restore_young_threshold`.

    What a message allocates dies young by reference counting; what a message in flight holds
    does not yet, and collecting every 700 walked it over and over and promoted it to the old
    generation, whose full collections then walked every open connection's objects: 7-13% of a
    gateway's CPU per one-listener message at 1,000-10,000 sockets, ~12% at 17,000 retained
    messages a second. A threshold the program set higher is left as it is."""
    threshold = gc.get_threshold()
    _young.append(threshold)
    if threshold[0] < young_threshold:
        gc.set_threshold(young_threshold, *threshold[1:])


def restore_young_threshold() -> None:
    """Undo the last :func:`raise_young_threshold`: the threshold it found, once the last
    gateway that raised it stops."""
    if _young:
        threshold = _young.pop()
        if not _young:
            gc.set_threshold(*threshold)


async def freeze_after_connects(
    connects: Callable[[], int],
    interval: float = 1.0,
    max_delay: float = 10.0,
) -> None:
    """Freeze what is alive after start-up, then once sockets have connected and a quiet
    ``interval`` followed (or every ``max_delay`` s while they keep connecting: a collection
    during a burst of reconnections stalled the loop 60-330 ms a second), and after every full
    collection the interpreter runs of its own accord.

    ``connects()`` counts the connections opened so far. A full collection comes first, so that
    no garbage is frozen: it walks only what was allocated since the last freeze. Freezing after
    CPython's own full collections (which it runs once a quarter more objects survived) keeps
    the next one to what is newer.
    """
    loop = asyncio.get_running_loop()

    def after_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2 and not _freezing:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_freeze)  # not within the collection itself

    gc.callbacks.append(after_collection)
    frozen_at: int | None = None
    seen = connects()
    busy_since: float | None = None
    try:
        while True:
            count, now = connects(), loop.time()
            busy = count != seen
            seen = count
            if busy and busy_since is None:
                busy_since = now
            overdue = busy_since is not None and now - busy_since >= max_delay
            if count != frozen_at and (not busy or overdue):
                _freeze()
                frozen_at, busy_since = count, None
            await asyncio.sleep(interval)
    finally:
        gc.callbacks.remove(after_collection)


def _freeze() -> None:
    global _freezing
    _freezing = True
    try:
        gc.collect()
        gc.freeze()
    finally:
        _freezing = False


def release_closed_transports() -> None:
    """On CPython 3.11, let a closed socket transport go without the cyclic collector.

    Its read callback is a bound method of its own, kept after close: a reference cycle per
    connection (TCP, TLS, Redis), which a freeze would keep forever. CPython 3.12 drops it
    (gh-100348); this does the same, once, on older versions.
    """
    if sys.version_info >= (3, 12):
        return
    transport_class: Any = getattr(selector_events, "_SelectorSocketTransport")  # noqa: B009
    original = transport_class._call_connection_lost
    if getattr(original, "releases_read_callback", False):
        return

    def call_connection_lost(self: Any, exc: BaseException | None) -> None:
        try:
            original(self, exc)
        finally:
            self._read_ready_cb = None

    call_connection_lost.releases_read_callback = True  # type: ignore[attr-defined]
    transport_class._call_connection_lost = call_connection_lost
