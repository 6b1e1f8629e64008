"""``bow-gateway history`` as a real process against a real gateway with a ``[[history]]``
rule: it prints a topic's kept messages as one listener may see them, and says why when not."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import aiohttp

from bow_gateway import Bow

from .support import AUTH, PATH, SECRET, base_config
from .support.cli import run
from .support.protocol2 import p2_bow

StartBow = Callable[[Bow], Awaitable[Bow]]
ROOM = "/chat/room1"


async def kept_room(start_bow: StartBow, http: aiohttp.ClientSession) -> str:
    """A gateway keeping /chat/#, with messages 1-10 in the room (the even ones for room 2)."""
    config = base_config(history=[{"filter": "/chat/#"}])
    bow = await start_bow(p2_bow(config))
    url = f"http://127.0.0.1:{bow.port}"
    for n in range(1, 11):
        audience = [{"room": 1 if n % 2 else 2}]
        body = {"name": ROOM, "payload": {"n": n}, "audience": audience}
        async with http.post(url + PATH, json=body, headers=AUTH) as response:
            assert response.status == 204
    return url


def member(room: int) -> list[str]:
    return ["--id", "marvin", "--criteria", json.dumps({"room": room}), "--secret", SECRET]


async def test_history_prints_the_last_messages_the_listener_may_see(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    url = await kept_room(start_bow, http)
    result = await run(
        "history", ROOM, "--url", url, "--version", "v1.3", "--last", "6", *member(1)
    )
    assert result.code == 0, result.err
    lines = [json.loads(line) for line in result.out.splitlines()]
    assert lines == [{"event": ROOM, "data": {"n": n}, "sequence": n} for n in (5, 7, 9)]
    assert "3 messages of /chat/room1" in result.err


async def test_history_from_a_sequence(start_bow: StartBow, http: aiohttp.ClientSession) -> None:
    url = await kept_room(start_bow, http)
    result = await run(
        "history", ROOM, "--url", url, "--version", "v1.3", "--from", "7", *member(2)
    )
    assert [json.loads(line)["sequence"] for line in result.out.splitlines()] == [8, 10]


async def test_history_of_a_topic_not_kept_is_refused(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    url = await kept_room(start_bow, http)
    result = await run("history", "/news", "--url", url, "--version", "v1.3", *member(1))
    assert result.code == 1
    assert "keeps no history" in result.err


async def test_history_says_one_message_in_the_singular(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    # Regression: "1 messages of /chat/room1".
    url = await kept_room(start_bow, http)
    result = await run(
        "history", ROOM, "--url", url, "--version", "v1.3", "--from", "9", *member(1)
    )
    assert result.code == 0, result.err
    assert result.err.strip().splitlines()[-1] == "1 message of /chat/room1"
