"""Keep long-lived objects out of CPython's full garbage collections, with ``gc.freeze()``.

At 10,000 sockets a gateway holds about a million objects that the cyclic collector tracks, and
a full collection walks every one of them: the event loop stalls for a second. Connections live
for minutes or hours, so once they are open their objects are moved to the permanent generation,
which collections skip. A closed connection's objects are still freed, by reference counting
(the outbound leaves no reference cycle behind: ``tests/test_websocket.py`` checks it).

Freezing is process-wide, so it is off unless the gateway owns its process (the ``gc_freeze``
setting; ``bow-gateway serve`` turns it on).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable


async def freeze_after_connects(connects: Callable[[], int], interval: float = 1.0) -> None:
    """Freeze what is alive after start-up, then each ``interval`` s in which sockets connected,
    and after every full collection the interpreter runs of its own accord.

    ``connects()`` counts the connections opened so far. A full collection comes first, so that
    no garbage is frozen: it walks only what was allocated since the last freeze. What survives
    a full collection is frozen too (a young one first), so that the next full one, which
    CPython runs once a quarter more objects have survived, walks only what is newer.
    """
    loop = asyncio.get_running_loop()

    def after_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            loop.call_soon_threadsafe(_freeze_survivors)  # not within the collection itself

    gc.callbacks.append(after_collection)
    frozen_at: int | None = None
    try:
        while True:
            count = connects()
            if count != frozen_at:
                gc.collect()
                gc.freeze()
                frozen_at = count
            await asyncio.sleep(interval)
    finally:
        gc.callbacks.remove(after_collection)


def _freeze_survivors() -> None:
    gc.collect(1)
    gc.freeze()
