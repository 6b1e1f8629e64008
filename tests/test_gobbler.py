"""The Gobbler WebSocket outbound (``clients.md`` section 14), end to end: a real gateway on a
free port with a ``[[history]]`` rule, and a client written from the seed's protocol section
alone (:mod:`.support.gobbler_client`): subscribe, every form of replay, cancel, send, REST
publish."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow
from bow_gateway.outbound import liveness

from .support import AUTH, Gateway, metric, token
from .support.gobbler import MEMBERS, gobbler_bow
from .support.gobbler_client import GobblerClient, GobblerMessage

Serve = Callable[[Bow], Awaitable[Gateway]]
ROOM = "/chat/room1"


@pytest.fixture
async def gateway(serve: Serve) -> Gateway:
    return await serve(gobbler_bow())


Open = Callable[..., Awaitable[GobblerClient]]


@pytest.fixture
async def open_client(gateway: Gateway, http: aiohttp.ClientSession) -> Any:
    clients: list[GobblerClient] = []

    async def open_(
        listener: str = "U1", criteria: dict[str, Any] | None = None, **kwargs: Any
    ) -> GobblerClient:
        client = await GobblerClient.open(
            http,
            gateway.url,
            token(listener, {"room": 1} if criteria is None else criteria),
            **kwargs,
        )
        clients.append(client)
        await client.status("#ok-connected")
        return client

    yield open_
    for client in clients:
        await client.close()


async def say(gateway: Gateway, n: int, name: str = ROOM, audience: Any = MEMBERS) -> None:
    await gateway.push({"name": name, "payload": f"message {n}", "audience": audience})


async def fill(gateway: Gateway, count: int) -> None:
    for n in range(1, count + 1):
        await say(gateway, n)


def sequences(messages: list[GobblerMessage]) -> list[int]:
    return [message.sequence for message in messages]


async def test_a_connection_is_greeted_with_its_user_id(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    client = await GobblerClient.open(
        http, gateway.url, token("marvin", {"room": 1}), query="?applicationId=phone1"
    )
    hello = await client.status("#ok-connected")
    assert hello.text == "You are connected to the server."
    assert hello.data["UserId"] == "marvin" and hello.data["ApplicationId"] == "phone1"
    assert int(hello.data["Time"]) > 0
    await client.close()


async def test_the_token_may_come_as_a_query_parameter(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    query = "?token=" + token("U1", {"room": 1})
    client = await GobblerClient.open(http, gateway.url, query=query)
    assert (await client.status("#ok-connected")).data["UserId"] == "U1"
    await client.close()


async def test_without_a_token_the_connection_is_closed_with_4002(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    client = await GobblerClient.open(http, gateway.url)
    assert await client.closed() == 4002


async def test_subscribe_receives_the_path_and_its_subtopics_live(
    gateway: Gateway, open_client: Open
) -> None:
    client = await open_client()
    await client.send(f"+ {ROOM}")
    await client.status("#subscribed-to")
    await say(gateway, 1, "/chat/room2")
    await say(gateway, 2)
    await say(gateway, 3, "/chat/room1/typing")
    first, second = await client.message(), await client.message()
    assert (first.path, first.sequence, first.body) == (ROOM, 1, "message 2")
    assert (second.path, second.body) == ("/chat/room1/typing", "message 3")


async def test_the_last_20_then_live(gateway: Gateway, open_client: Open) -> None:
    await fill(gateway, 30)
    client = await open_client()
    start, messages, done = await client.fetch(f"+ {ROOM} -20")
    assert start.text == f"{ROOM} 20" and done.text == ROOM
    assert sequences(messages) == list(range(11, 31))
    await client.status("#subscribed-to")
    await say(gateway, 31)
    assert (await client.message()).sequence == 31


async def test_from_sequence_42_then_live(gateway: Gateway, open_client: Open) -> None:
    await fill(gateway, 50)
    client = await open_client()
    _, messages, _ = await client.fetch(f"+ {ROOM} 42")
    assert sequences(messages) == list(range(42, 51))
    await client.status("#subscribed-to")
    await say(gateway, 51)
    assert (await client.message()).sequence == 51


async def test_the_first_20_and_stop(gateway: Gateway, open_client: Open) -> None:
    await fill(gateway, 30)
    client = await open_client()
    _, messages, _ = await client.fetch(f"+ {ROOM} 0 20")
    assert sequences(messages) == list(range(1, 21))
    await say(gateway, 31)
    assert await client.nothing_within(0.3)


async def test_the_last_20_and_stop(gateway: Gateway, open_client: Open) -> None:
    await fill(gateway, 30)
    client = await open_client()
    _, messages, _ = await client.fetch(f"+ {ROOM} -20 20")
    assert sequences(messages) == list(range(11, 31))
    await say(gateway, 31)
    assert await client.nothing_within(0.3)


async def test_start_and_count_may_be_separated_by_a_comma(
    gateway: Gateway, open_client: Open
) -> None:
    await fill(gateway, 10)
    client = await open_client()
    _, messages, _ = await client.fetch(f"+ {ROOM} -5,3")
    assert sequences(messages) == [6, 7, 8]


async def test_replay_shows_only_what_the_criteria_of_now_match(
    gateway: Gateway, open_client: Open
) -> None:
    for n in range(1, 11):
        await say(gateway, n, audience=MEMBERS if n % 2 else [{"room": 2}])
    client = await open_client()
    _, messages, _ = await client.fetch(f"+ {ROOM} 0 100")
    assert sequences(messages) == [1, 3, 5, 7, 9]


async def fill_with_one_hidden(gateway: Gateway, hidden: int, count: int = 4) -> None:
    """``count`` messages to the room, message ``hidden`` to another room (not the listener's)."""
    for n in range(1, count + 1):
        await say(gateway, n, audience=[{"room": 2}] if n == hidden else MEMBERS)


async def test_fetch_start_counts_only_what_the_criteria_let_through(
    gateway: Gateway, open_client: Open
) -> None:
    """Guards against ``#fetch-start`` counting the stored range (4) instead of the 3 messages
    that follow, which also told the listener that a message it may not see exists."""
    await fill_with_one_hidden(gateway, hidden=3)
    client = await open_client()
    start, messages, _ = await client.fetch(f"+ {ROOM} 0")
    assert sequences(messages) == [1, 2, 4]
    assert start.text == f"{ROOM} 3"


async def test_fetch_start_of_the_last_n_counts_only_what_follows(
    gateway: Gateway, open_client: Open
) -> None:
    """Guards against ``+ path -4`` announcing 4 (the last 4 stored) when one is hidden."""
    await fill_with_one_hidden(gateway, hidden=3, count=6)
    client = await open_client()
    start, messages, _ = await client.fetch(f"+ {ROOM} -4")
    assert sequences(messages) == [4, 5, 6]
    assert start.text == f"{ROOM} 3"


async def test_fetch_start_of_a_range_past_the_end_counts_only_what_follows(
    gateway: Gateway, open_client: Open
) -> None:
    """Guards against ``+ path 3 100`` announcing the 2 stored from 3 on when one is hidden."""
    await fill_with_one_hidden(gateway, hidden=4)
    client = await open_client()
    start, messages, _ = await client.fetch(f"+ {ROOM} 3 100")
    assert sequences(messages) == [3]
    assert start.text == f"{ROOM} 1"


async def test_fetch_start_is_zero_when_the_listener_may_see_nothing_in_the_range(
    gateway: Gateway, open_client: Open
) -> None:
    """Guards against ``#fetch-start path 2`` followed by no message at all (an empty fetch)."""
    for n in range(1, 3):
        await say(gateway, n, audience=[{"room": 2}])
    client = await open_client()
    start, messages, _ = await client.fetch(f"+ {ROOM} 0 10")
    assert (start.text, messages) == (f"{ROOM} 0", [])


async def test_fetch_start_leaves_out_what_is_past_the_history_filters_max_age(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    """Guards against counting messages still stored but past the max_age of the ``[[history]]``
    filter keeping the topic, which the fetch skips."""
    gateway = await serve(gobbler_bow(history=[{"filter": "/chat/#", "max_age": 0.3}]))
    await fill(gateway, 3)
    await asyncio.sleep(0.5)
    client = await GobblerClient.open(http, gateway.url, token("U1", {"room": 1}))
    await client.status("#ok-connected")
    start, messages, _ = await client.fetch(f"+ {ROOM} 0 10")
    await client.close()
    assert (start.text, messages) == (f"{ROOM} 0", [])


async def test_fetch_start_of_a_path_counts_none_of_its_subtopics(
    gateway: Gateway, open_client: Open
) -> None:
    """The subscription's topic filter (``/chat/room1/#``) takes subtopics live, but a fetch
    reads the path's own history only, and its count says so (guards the count's scope)."""
    await say(gateway, 1)
    await say(gateway, 2, "/chat/room1/typing")
    client = await open_client()
    start, messages, _ = await client.fetch(f"+ {ROOM} 0")
    assert [(message.path, message.body) for message in messages] == [(ROOM, "message 1")]
    assert start.text == f"{ROOM} 1"


async def test_a_fetch_joins_live_delivery_without_a_gap_or_a_repeat(
    gateway: Gateway, open_client: Open
) -> None:
    await fill(gateway, 300)
    client = await open_client()

    async def more() -> None:
        for n in range(301, 401):
            await say(gateway, n)

    publishing = asyncio.create_task(more())
    _, messages, _ = await client.fetch(f"+ {ROOM} 0")
    await publishing
    seen = sequences(messages)
    await client.status("#subscribed-to")
    while len(seen) < 400:
        seen.append((await client.message()).sequence)
    assert seen == list(range(1, 401))
    assert await client.nothing_within(0.2)


async def test_cancel_stops_live_delivery(gateway: Gateway, open_client: Open) -> None:
    client = await open_client()
    await client.send(f"+ {ROOM}")
    await client.status("#subscribed-to")
    await client.send(f"- {ROOM}")
    assert (await client.status("#canceled")).text == ROOM
    await say(gateway, 1)
    assert await client.nothing_within(0.3)


async def test_send_publishes_with_headers_and_says_its_sequence(
    gateway: Gateway, open_client: Open
) -> None:
    listener = await open_client("U2")
    await listener.send(f"+ {ROOM}")
    await listener.status("#subscribed-to")
    sender = await open_client("U1", query="?applicationId=phone1")
    await sender.send(f'> {ROOM} m1\n{{"Content-Type": "text/plain"}}\nHello World')
    sent = await sender.status("#send")
    assert sent.text == "m1"
    assert sent.data["sequenceId"] == "1" and sent.data["path"] == ROOM
    assert sent.data["publisherMessageId"] == "m1"
    got = await listener.message()
    assert (got.path, got.sequence, got.body) == (ROOM, 1, "Hello World")
    assert (got.user_id, got.application_id, got.message_id) == ("U1", "phone1", "m1")
    assert got.headers == {"Content-Type": "text/plain"}


async def test_a_send_without_headers_takes_the_rest_as_its_body(
    gateway: Gateway, open_client: Open
) -> None:
    client = await open_client()
    await client.send(f"+ {ROOM}")
    await client.status("#subscribed-to")
    await client.send(f"> {ROOM}\nHello World")
    frames = [await client.next(), await client.next()]  # #send and the message, either order
    [got] = [frame for frame in frames if isinstance(frame, GobblerMessage)]
    assert (got.body, got.headers, got.message_id) == ("Hello World", {}, "")


async def test_a_refused_send_is_an_error_send(gateway: Gateway, open_client: Open) -> None:
    client = await open_client()
    await client.send("> /closed/room m2\nHello")
    refused = await client.status("!error-send")
    assert refused.text.startswith("m2 ") and "/closed/room is closed" in refused.text


async def test_a_refused_send_invents_no_sequence_id(gateway: Gateway, open_client: Open) -> None:
    """Guards against ``!error-send`` carrying ``"sequenceId": "0"``: nothing was kept, so
    there is no sequence to give (a client could take 0 for one)."""
    client = await open_client()
    await client.send("> /closed/room m2\nHello")
    refused = await client.status("!error-send")
    assert "sequenceId" not in refused.data
    assert refused.data["path"] == "/closed/room" and refused.data["publisherMessageId"] == "m2"


async def test_a_rest_publish_reaches_subscribers_with_its_headers(
    gateway: Gateway, open_client: Open
) -> None:
    client = await open_client()
    await client.send(f"+ {ROOM}")
    await client.status("#subscribed-to")
    headers = {**AUTH, "X-Gobbler-Key": "Value", "Content-Type": "text/plain"}
    url = gateway.url + "/api/message/chat/room1?userId=marvin&messageId=42"
    async with gateway.http.post(url, data=b"Hello", headers=headers) as response:
        assert response.status == 204, await response.text()
    got = await client.message()
    assert (got.path, got.user_id, got.message_id, got.body) == (ROOM, "marvin", "42", "Hello")
    assert got.headers == {"Key": "Value"}
    assert got.sequence == 1


async def test_an_unknown_command_is_a_bad_request(gateway: Gateway, open_client: Open) -> None:
    client = await open_client()
    await client.send("sdcsd")
    assert (await client.status("!error-bad-request")).text == "unknown command 'sdcsd'"


async def test_a_filter_is_not_a_path(gateway: Gateway, open_client: Open) -> None:
    client = await open_client()
    await client.send("+ /chat/#")
    await client.status("!error-bad-request")


async def test_gobbler_connections_are_counted_by_protocol(
    gateway: Gateway, open_client: Open
) -> None:
    await open_client()
    labels = 'outbound="v1",protocol="gobbler"'
    assert await metric(gateway, f"bow_sockets_connected{{{labels}}}") == 1


async def test_subscriptions_past_max_filters_are_refused(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    gateway = await serve(gobbler_bow(outbound={"timeout": 5, "max_filters": 2}))
    client = await GobblerClient.open(http, gateway.url, token("U1", {"room": 1}))
    await client.status("#ok-connected")
    for path in ("/a", "/b", "/a"):
        await client.send(f"+ {path}")
        await client.status("#subscribed-to")
    await client.send("+ /c")
    assert "at most 2 subscriptions" in (await client.status("!error-bad-request")).text
    await client.close()


async def test_pings_cut_off_a_client_that_answers_none_and_keep_one_that_does(
    gateway: Gateway, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's pings (:mod:`bow_gateway.outbound.liveness`, as Flywheel's): the client's
    pongs come to the gateway's read loop, counted, and do not end the connection."""
    monkeypatch.setattr(liveness, "PING_EVERY", 0.1)
    monkeypatch.setattr(liveness, "PONG_WITHIN", 0.3)
    monkeypatch.setattr(liveness, "SWEEP", 0.05)
    headers = {"Authorization": f"Bearer {token('U1', {'room': 1})}"}
    url = gateway.url.replace("http", "ws", 1) + "/gobbler"
    mute = GobblerClient(await http.ws_connect(url, headers=headers, autoping=False))
    polite = GobblerClient(await http.ws_connect(url, headers=headers))
    for client in (mute, polite):
        await client.status("#ok-connected")
    await polite.send(f"+ {ROOM}")
    await polite.status("#subscribed-to")
    reading = asyncio.create_task(polite.next())  # aiohttp answers pings while it reads
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(3.0):
        while (await mute.websocket.receive()).type is aiohttp.WSMsgType.PING:
            pass  # not answered
    assert mute.websocket.closed
    await asyncio.sleep(max(0.0, 1.5 - (asyncio.get_running_loop().time() - started)))
    assert not reading.done()  # some 7 pings answered meanwhile
    await say(gateway, 1)
    message = await reading
    assert isinstance(message, GobblerMessage) and message.body == "message 1"
    await polite.close()


# -- hostile sends (issue 27) ---------------------------------------------------------------------


async def test_a_send_whose_path_forges_the_sender_is_refused(
    gateway: Gateway, open_client: Open
) -> None:
    """Guards against commas in a path forging the first line's fields: ``publisherUserId``
    read ``ADMIN`` by every subscriber."""
    listener = await open_client("U2")
    await listener.send(f"+ {ROOM}")
    await listener.status("#subscribed-to")
    attacker = await open_client("U1")
    await attacker.send(f"> {ROOM},7,ADMIN,admin-app,m-9,1700000000 m1\nHello")
    refused = await attacker.status("!error-send")
    assert refused.text.startswith("m1 ") and "must not hold a comma" in refused.text
    assert "sequenceId" not in refused.data
    await say(gateway, 1)
    got = await listener.message()
    assert (got.path, got.user_id, got.body) == (ROOM, "", "message 1")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("__disconnect", "a client may not publish names starting with __ or $"),
        ("$remote/s-1/rx/alerts", "a client may not publish names starting with __ or $"),
        ("/chat/room1\x85forged", "nor a control or bidirectional character"),
        ("/chat/\u202e1moor", "nor a control or bidirectional character"),
        ("/chat/room1\r", "nor a control or bidirectional character"),
        ("/chat/room1/", "has an empty level"),
        ("/chat//room1", "has an empty level"),
        ("/chat/+", "has a + or # level"),
    ],
)
async def test_a_send_to_a_path_no_message_may_have_is_an_error_send(
    gateway: Gateway, open_client: Open, path: str, why: str
) -> None:
    listener = await open_client("U2")
    await listener.send("+ /chat")
    await listener.status("#subscribed-to")
    client = await open_client()
    await client.send(f"> {path} m3\nHello")
    refused = await client.status("!error-send")
    assert refused.text.startswith("m3 ") and why in refused.text, refused
    assert refused.data["path"] == path and refused.data["publisherMessageId"] == "m3"
    await say(gateway, 1)
    assert (await listener.message()).body == "message 1"


async def test_a_send_s_message_id_is_held_to_the_same_characters(
    gateway: Gateway, open_client: Open
) -> None:
    client = await open_client()
    await client.send(f"> {ROOM} m\u202e4\nHello")
    refused = await client.status("!error-send")
    assert "message_id: must not hold a comma or a line break" in refused.text


@pytest.mark.parametrize(
    ("topic", "why"),
    [
        ("chat/room1%00", "nor a control or bidirectional character"),
        ("chat/room1%E2%80%AE", "nor a control or bidirectional character"),
        ("chat/room1%2C7%2CADMIN", "must not hold a comma"),
        ("chat/room1/", "has an empty level"),
        ("chat//room1", "has an empty level"),
    ],
)
async def test_a_rest_publish_to_a_path_no_message_may_have_is_422(
    gateway: Gateway, open_client: Open, topic: str, why: str
) -> None:
    listener = await open_client()
    await listener.send("+ /chat")
    await listener.status("#subscribed-to")
    url = gateway.url + "/api/message/" + topic
    async with gateway.http.post(url, data=b"Hello", headers=AUTH) as response:
        assert response.status == 422
        assert why in await response.text()
    await say(gateway, 1)
    assert (await listener.message()).body == "message 1"


# -- issue 27: replays are bounded --------------------------------------------------------


async def test_a_replay_flood_is_rate_limited_per_connection_and_per_listener_id(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    gateway = await serve(gobbler_bow(recovery={"max_replays_per_minute": 5}))
    await fill(gateway, 3)
    first = await GobblerClient.open(http, gateway.url, token("U1", {"room": 1}))
    await first.status("#ok-connected")
    for _ in range(5):
        start, messages, _ = await first.fetch(f"+ {ROOM} 0 100")
        assert start.text == f"{ROOM} 3" and len(messages) == 3
    await first.send(f"+ {ROOM} 0 100")
    refused = await first.status("!error-bad-request")
    assert "recovery.max_replays_per_minute" in refused.text
    # Another connection of the same listener id shares the id's bucket
    second = await GobblerClient.open(http, gateway.url, token("U1", {"room": 1}))
    await second.status("#ok-connected")
    await second.send(f"+ {ROOM} -1")
    assert "replays a minute" in (await second.status("!error-bad-request")).text
    # Another listener is not affected
    other = await GobblerClient.open(http, gateway.url, token("U2", {"room": 1}))
    await other.status("#ok-connected")
    start, messages, _ = await other.fetch(f"+ {ROOM} 0 100")
    assert len(messages) == 3
    for client in (first, second, other):
        await client.close()


async def test_a_fetch_over_recovery_max_bytes_is_refused_and_subscribes_to_nothing(
    serve: Serve, open_client: Open
) -> None:
    gateway = await serve(gobbler_bow(recovery={"max_bytes": 50_000}))
    for _ in range(4):
        await gateway.push({"name": ROOM, "payload": "x" * 20_000, "audience": MEMBERS})
    client = await GobblerClient.open(gateway.http, gateway.url, token("U1", {"room": 1}))
    await client.status("#ok-connected")
    await client.send(f"+ {ROOM} 0")
    refused = await client.status("!error-bad-request")
    assert "recovery.max_bytes" in refused.text
    await say(gateway, 99)
    assert await client.nothing_within(0.3)  # not subscribed
    start, messages, _ = await client.fetch(f"+ {ROOM} -2 2")  # 40 KB: within the bound
    assert start.text == f"{ROOM} 2" and len(messages) == 2
    await client.close()


async def test_a_big_fetch_never_holds_its_frames_all_at_once(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    """Guards against a fetch that encodes its whole replay before ``#fetch-start`` (issue 27):
    10 connections each fetching 5,000 messages of 1 KB (5 MB of frames each, 58 MB held at
    once in all) hold at most a slice or two of frames each at a time (1.6 MB in all), with
    ``#fetch-start`` still exact."""
    entries, clients_count = 5_000, 10
    most = clients_count * 2 * 256 * 1_024  # 2 slices (256 messages) of frames per fetch
    gateway = await serve(gobbler_bow(history=[{"filter": "/chat/#", "max_count": entries}]))
    message = {"name": ROOM, "payload": "x" * 1_000, "audience": MEMBERS}
    for _ in range(entries // 500):
        await gateway.push([message] * 500)  # a batch under inbound.max_body_size
    clients = []
    for n in range(clients_count):
        client = await GobblerClient.open(http, gateway.url, token(f"U{n}", {"room": 1}))
        await client.status("#ok-connected")
        clients.append(client)

    async def fetch(client: GobblerClient) -> tuple[str, int]:
        await client.send(f"+ {ROOM} 0 {entries}")
        start = await client.status("#fetch-start")
        received = 0
        while True:
            frame = await client.websocket.receive(timeout=30)
            assert frame.type is aiohttp.WSMsgType.TEXT, frame
            if str(frame.data).startswith("#fetch-done"):
                return start.text, received
            received += 1

    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        fetched = await asyncio.gather(*(fetch(client) for client in clients))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert fetched == [(f"{ROOM} {entries}", entries)] * clients_count
    print("PEAK", (peak - before) / 1e6)
    assert peak - before < most, f"{(peak - before) / 1e6:.1f} MB held at once"
    for client in clients:
        await client.close()


async def test_a_fetch_writes_what_it_counted_though_the_history_moves_on_meanwhile(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    """Guards against a fetch that counts entries, then reads them again to write them: the
    history replaced while the client is slow to read (3,000 messages pushed after
    ``#fetch-start``, past ``max_count``), what follows is still exactly what was counted."""
    entries = 3_000
    gateway = await serve(gobbler_bow(history=[{"filter": "/chat/#", "max_count": entries}]))

    async def push_all(text: str) -> None:
        message = {"name": ROOM, "payload": text * 1_000, "audience": MEMBERS}
        for _ in range(entries // 500):
            await gateway.push([message] * 500)

    await push_all("a")
    client = await GobblerClient.open(http, gateway.url, token("U1", {"room": 1}))
    await client.status("#ok-connected")
    await client.send(f"+ {ROOM} 0 {entries}")
    start = await client.status("#fetch-start")
    assert start.text == f"{ROOM} {entries}"
    await push_all("b")  # the history now holds none of what the fetch counted
    messages = []
    while isinstance(frame := await client.next(), GobblerMessage):
        messages.append(frame)
    assert frame.kind == "#fetch-done", frame
    assert sequences(messages) == list(range(1, entries + 1))
    assert {message.body for message in messages} == {"a" * 1_000}
    await client.close()
