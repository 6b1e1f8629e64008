"""Flywheel's session leases on their own (:mod:`bow_gateway.outbound.sessions`): renewed while
bound, and let go here when they may have ended, over the in-process backplane with short ttls.
Across real instances: ``test_flywheel_instances.py``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from bow_gateway.backplanes import BackplaneUnavailable, MemoryBackplane
from bow_gateway.core.plugins import OutboundPlugin
from bow_gateway.outbound.connection import Connection
from bow_gateway.outbound.sessions import Sessions

PLUGIN = OutboundPlugin("v1", lambda token: {"id": token}, "v1")


class Here:
    """One instance's sessions over ``backplane``, what they wrote, and their renewals."""

    def __init__(self, backplane: MemoryBackplane, ttl: float) -> None:
        self.backplane = backplane
        self.failing = False  # the backplane out of reach
        self.written: list[tuple[Connection, bytes]] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.sessions = Sessions(self._spawn, self._write, self._hold, backplane.let_go, ttl=ttl)

    async def _hold(self, key: str, owner: str, ttl: float) -> bool:
        if self.failing:
            raise BackplaneUnavailable("Redis did not take the lease")
        return await self.backplane.hold(key, owner, ttl)

    def _write(self, connection: Connection, frame: bytes) -> None:
        self.written.append((connection, frame))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def renewing_for(self, seconds: float) -> None:
        task = asyncio.create_task(self.sessions.renew())
        await asyncio.sleep(seconds)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def errors(self) -> list[tuple[str, str]]:
        """What was written: each frame's topic and its errors' descriptions."""
        found = []
        for _, frame in self.written:
            text = frame[frame.index(b"R $remote/") :].decode()  # after the frame's header
            topic, _, body = text.removeprefix("R ").partition(" ")
            found += [(topic, error["description"]) for error in json.loads(body)]
        return found


@pytest.fixture
async def backplane() -> AsyncIterator[MemoryBackplane]:
    backplane = MemoryBackplane()
    await backplane.connect()
    yield backplane
    await backplane.disconnect()


def listener(listener_id: str) -> Connection:
    connection = Connection(f"fw-{listener_id}", f"fw-{listener_id}", PLUGIN)
    connection.listener_id = listener_id
    return connection


async def test_a_lease_renewed_outlives_its_ttl(backplane: MemoryBackplane) -> None:
    here = Here(backplane, ttl=0.6)
    assert await here.sessions.join(listener("T1"), "s-1")
    await here.renewing_for(1.0)
    assert not await backplane.hold("session:s-1", json.dumps("T2"), 30)


async def test_a_lease_another_listener_took_is_let_go_here_and_its_connections_told(
    backplane: MemoryBackplane,
) -> None:
    """Its hold ended unrenewed (the backplane out of reach) and another took it: this instance
    no longer routes the session's direct messages to its old holder."""
    here = Here(backplane, ttl=0.3)
    connection = listener("T1")
    assert await here.sessions.join(connection, "s-1")
    await asyncio.sleep(0.4)  # not renewed: ended
    assert await backplane.hold("session:s-1", json.dumps("T2"), 30)
    await here.renewing_for(0.2)
    assert connection.session is None and here.sessions.bound == {}
    assert here.errors() == [
        ("$remote/s-1/rx/errors", "sessionId 's-1' was let go: another listener holds it now")
    ]


async def test_a_lease_not_renewed_for_two_thirds_of_its_ttl_is_let_go_here(
    backplane: MemoryBackplane,
) -> None:
    """It could end before the next renewal, and another identity take it: fail closed."""
    here = Here(backplane, ttl=1.5)
    connection = listener("T1")
    assert await here.sessions.join(connection, "s-1")
    here.failing = True
    await here.renewing_for(0.7)  # one renewal failed, 0.5 s after the hold: still held
    assert connection.session == "s-1"
    await here.renewing_for(0.9)  # the next, 1.2 s after: past 1 s
    assert connection.session is None and here.sessions.bound == {}
    [(topic, description)] = here.errors()
    assert topic == "$remote/s-1/rx/errors" and "out of reach" in description


async def test_a_bind_right_after_the_last_holder_left_lets_the_lease_go_first(
    backplane: MemoryBackplane,
) -> None:
    """The let-go runs in the background: a bind of another identity before it lets go of the
    lease itself, then takes it."""
    here = Here(backplane, ttl=30)
    first = listener("T1")
    assert await here.sessions.join(first, "s-1")
    here.sessions.leave(first)
    assert await here.sessions.join(listener("T2"), "s-1")
    await asyncio.gather(*here.tasks)
    assert not await backplane.hold("session:s-1", json.dumps("T1"), 30)  # T2's, still
