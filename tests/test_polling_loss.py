"""Long-polling listeners lose no accepted message (issue 11, failure 3): a poll response carries
what the python-engineio client accepts (it refuses a payload of more than 16 packets, and then
drops the connection), so a burst, or the backlog released when Redis wakes up, reaches a
long-polling python-socketio listener as whole as it reaches a websocket one."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from .support import AUTH, PATH, Listener, base_config, standard_bow, token, until
from .support.redis_faults import END, Publisher, until_ends
from .support.redis_server import RedisServer

FANS = [{"role": "fan"}]
BURST = 60
TOTAL, RATE = 2_000, 100.0  # POSTs in all, and per second, across every publisher
PUBLISHERS_PER_INSTANCE = 20  # a backend's workers, each one POST at a time
FREEZE = 5.0  # seconds Redis is stopped (SIGSTOP ... SIGCONT)


def lost(events: list[tuple[str, Any]], publishers: list[Publisher], listener: str) -> list[str]:
    """What ``listener`` got wrong: accepted messages missing, repeated or out of order per
    publisher, and anything else than ticks; empty when it received every accepted message."""
    ticks = [body for name, body in events if name == "tick"]
    problems = [  # "disconnected" or "no end marker" (see until_ends), or an unexpected event
        f"{listener}: {name}" + ("" if body is None else f" {body!r}")
        for name, body in events
        if name != "tick"
    ]
    missing: list[tuple[str, int]] = []
    for publisher in publishers:
        got = [body["n"] for body in ticks if body["src"] == publisher.name]
        accepted = {post.n for post in publisher.posts if post.status == 204}
        missing += [(publisher.name, n) for n in sorted(accepted - set(got))]
        if len(got) != len(set(got)):
            problems.append(f"{listener} got messages of {publisher.name} twice")
        if got != sorted(got):
            problems.append(f"{listener} got messages of {publisher.name} out of order")
    if missing:
        accepted_in_all = sum(publisher.accepted() for publisher in publishers)
        problems.append(
            f"{listener} lost {len(missing)} of {accepted_in_all} accepted messages "
            f"(publisher, n: {missing[:5]}...)"
        )
    return problems


async def test_a_burst_of_accepted_messages_reaches_polling_and_websocket_listeners_whole(
    listeners: Callable[..., Awaitable[Listener]],
    push: Callable[..., Awaitable[aiohttp.ClientResponse]],
) -> None:
    polling = await listeners("FAN/polling", {"role": "fan"}, transports=["polling"])
    websocket = await listeners("FAN/websocket", {"role": "fan"})
    assert (polling.client.transport(), websocket.client.transport()) == ("polling", "websocket")

    answers = await asyncio.gather(
        *(push({"name": "tick", "audience": FANS, "src": "A", "n": n}) for n in range(BURST))
    )
    assert [answer.status for answer in answers] == [204] * BURST
    assert (await push({"name": END, "audience": FANS})).status == 204

    received = await asyncio.gather(until_ends(polling, 1), until_ends(websocket, 1))
    for name, events in zip(("polling", "websocket"), received, strict=True):
        got = sorted(body["n"] for event, body in events if event == "tick")
        assert got == list(range(BURST)), (
            f"the {name} listener received {len(got)} of {BURST} accepted messages, then: "
            f"{[event for event, _ in events if event != 'tick']}"
        )
        assert len(events) == BURST, f"the {name} listener: {events[BURST:]}"


@pytest.mark.slow
async def test_accepted_messages_reach_polling_listeners_of_two_instances_through_a_redis_freeze(
    http: aiohttp.ClientSession,
) -> None:
    with RedisServer() as redis_server:
        async with contextlib.AsyncExitStack() as stack:  # instances and listeners, before Redis
            config = base_config(redis=redis_server.url, namespace=f"poll-{uuid.uuid4().hex[:8]}")
            urls = []
            for _ in range(2):
                instance = standard_bow(config)
                await instance.start()
                stack.push_async_callback(instance.stop)
                urls.append(f"http://127.0.0.1:{instance.port}")

            listeners: dict[str, Listener] = {}

            async def close_listeners() -> None:  # all at once: python-engineio's client takes
                # ~30 s to close a long-polling connection (its pending GET runs out)
                await asyncio.gather(*(listener.close() for listener in listeners.values()))

            stack.push_async_callback(close_listeners)
            for number, url in enumerate(urls):
                for transport in ("polling", "websocket"):
                    listener = Listener(url)
                    listeners[f"{transport} listener on instance {number}"] = listener
                    await listener.connect(transports=[transport])
                    await listener.authenticate(token(f"FAN/{transport}{number}", {"role": "fan"}))
                    assert listener.client.transport() == transport

            # Publishers on both instances, each one POST at a time, together ~RATE POST/s,
            # started evenly spread: when Redis wakes up, what each was waiting for is accepted
            # at once (a burst).
            interval = len(urls) * PUBLISHERS_PER_INSTANCE / RATE
            limit = TOTAL // (len(urls) * PUBLISHERS_PER_INSTANCE)
            publishers = [
                Publisher(f"{number}-{k}", url, FANS, interval=interval, limit=limit)
                for number, url in enumerate(urls)
                for k in range(PUBLISHERS_PER_INSTANCE)
            ]
            stop = asyncio.Event()

            async def run(publisher: Publisher, delay: float) -> None:
                await asyncio.sleep(delay)
                await publisher.run(http, stop)

            def posted() -> int:
                return sum(len(publisher.posts) for publisher in publishers)

            tasks = [
                asyncio.create_task(run(publisher, k * interval / len(publishers)))
                for k, publisher in enumerate(publishers)
            ]
            try:
                await until(lambda: posted() >= TOTAL * 0.4, f"{TOTAL * 0.4:.0f} POSTs", timeout=30)
                redis_server.pause()
                frozen = time.monotonic()
                try:
                    await asyncio.sleep(FREEZE)  # the fault itself lasts this long
                finally:
                    redis_server.resume()
                thawed = time.monotonic()
                await asyncio.wait_for(asyncio.gather(*tasks), 60)
            finally:
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)

            for url in urls:  # one end marker from each instance, after every tick
                async with http.post(
                    url + PATH, json={"name": END, "audience": FANS}, headers=AUTH
                ) as response:
                    assert response.status == 204
            received = await asyncio.gather(
                *(until_ends(listener, len(urls), timeout=15) for listener in listeners.values())
            )

    posts = [post for publisher in publishers for post in publisher.posts]
    statuses = {post.status for post in posts}
    assert statuses <= {204, 503}, f"statuses {statuses}"
    accepted = sum(post.status == 204 for post in posts)
    refused = sum(post.status == 503 for post in posts)
    during = [post for post in posts if frozen < post.started and post.ended < thawed]
    assert during and all(post.status == 503 for post in during), "a POST got 204 while frozen"
    assert accepted >= TOTAL * 0.8, f"only {accepted} of {len(posts)} POSTs accepted"

    problems = [
        problem
        for name, events in zip(listeners, received, strict=True)
        for problem in lost(events, publishers, name)
    ]
    assert not problems, (
        f"{len(posts)} POSTs, {accepted} answered 204, {refused} answered 503 (retried by a "
        "backend):\n" + "\n".join(problems)
    )
