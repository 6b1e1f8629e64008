"""The Server-Sent Events outbound (``clients.md`` section 13), end to end: a real gateway on a
free port, aiohttp's client (and ``curl -N``) reading the stream as it comes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import logging
import shutil
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from bow_gateway.outbounds.jwt import mint

from bow_gateway import Bow
from bow_gateway.outbound.protocols import sse

from .support import AUTH, PATH, SECRET, WAIT, Gateway, base_config, standard_bow, token, until
from .support.protocol2 import p2_bow
from .support.sse_client import Stream, data

BLOG_42 = [{"blogId": 42}]


Open = Callable[..., Awaitable[Stream]]


@pytest.fixture
async def open_stream(gateway: Gateway) -> AsyncIterator[Open]:
    responses: list[aiohttp.ClientResponse] = []

    async def open_(
        listener_token: str | None = None,
        *,
        params: Any = None,
        headers: dict[str, str] | None = None,
        status: int = 200,
    ) -> Stream:
        query: list[tuple[str, str]] = list(params or [])
        all_headers = dict(headers or {})
        if listener_token is not None:
            all_headers["Authorization"] = f"Bearer {listener_token}"
        response = await gateway.http.get(
            gateway.url + "/events", params=query, headers=all_headers
        )
        responses.append(response)
        assert response.status == status, await response.text()
        if status == 200:
            assert response.headers["Content-Type"] == "text/event-stream"
        return Stream(response)

    yield open_
    for response in responses:
        response.close()


async def push(gateway: Gateway, body: Any) -> str:
    async with gateway.http.post(gateway.url + PATH, json=body, headers=AUTH) as response:
        assert response.status == 204, await response.text()
        return response.headers["Bow-Position"]


async def test_events_carry_their_positions(gateway: Gateway, open_stream: Open) -> None:
    stream = await open_stream(token("READER", {"blogId": 42}))
    await _ready(gateway)
    one = {"name": "post", "n": 1, "audience": BLOG_42}
    two = {"name": "post", "n": "é", "audience": BLOG_42}
    first = await push(gateway, one)
    await push(gateway, {"name": "other", "audience": [{"blogId": 7}]})
    second = await push(gateway, two)
    assert await stream.next() == {"id": first, "event": "post", "data": data(one)}
    assert await stream.next() == {"id": second, "event": "post", "data": data(two)}


async def test_topic_filters_narrow_the_stream(gateway: Gateway, open_stream: Open) -> None:
    stream = await open_stream(
        token("READER", {"blogId": 42}), params=[("topic", "quotes/+"), ("topic", "news/#")]
    )
    await _ready(gateway)
    for name in ("quotes/EURUSD", "quotes/a/b", "weather", "news/x/y"):
        await push(gateway, {"name": name, "audience": BLOG_42})
    assert (await stream.next())["event"] == "quotes/EURUSD"
    assert (await stream.next())["event"] == "news/x/y"


async def test_last_event_id_recovers_exactly_the_missed_messages(
    gateway: Gateway, open_stream: Open
) -> None:
    reader = token("READER", {"blogId": 42})
    stream = await open_stream(reader)
    await _ready(gateway)
    seen = await push(gateway, {"name": "seen", "audience": BLOG_42})
    assert (await stream.next())["id"] == seen
    stream.response.close()
    await _until_streams(gateway, 0)
    missed = [await push(gateway, {"name": f"missed-{n}", "audience": BLOG_42}) for n in range(3)]
    await push(gateway, {"name": "not-mine", "audience": [{"blogId": 7}]})
    again = await open_stream(reader, headers={"Last-Event-ID": seen})
    for n, position in enumerate(missed):
        event = await again.next()
        assert (event["id"], event["event"]) == (position, f"missed-{n}")
    live = await push(gateway, {"name": "live", "audience": BLOG_42})
    assert (await again.next())["id"] == live
    # lastEventId as a query parameter works the same
    third = await open_stream(reader, params=[("lastEventId", missed[1])])
    assert (await third.next())["id"] == missed[2]
    assert (await third.next())["id"] == live


async def test_a_failed_recovery_starts_with_a_gap(gateway: Gateway, open_stream: Open) -> None:
    stream = await open_stream(token("READER"), headers={"Last-Event-ID": "nonsense"})
    event = await stream.next()
    assert event["event"] == "__gap"
    assert json.loads(event["data"])["reason"] == "unknown_position"


@pytest.mark.parametrize(
    ("params", "headers", "status", "reason"),
    [
        ([], {}, 401, "auth_refused"),
        ([("token", "not-a-jwt")], {}, 401, "auth_refused"),
        ([], {"Authorization": "Bearer not-a-jwt"}, 401, "auth_refused"),
        ([("topic", "a/#/b")], None, 400, "bad_request"),
        ([("topic", "$SYS/x")], None, 400, "bad_request"),
        ([("v", "v9")], None, 404, "unknown_version"),
    ],
)
async def test_refusals_are_json_before_the_stream(
    open_stream: Open, params: Any, headers: Any, status: int, reason: str
) -> None:
    good = None if headers is not None else token("READER")
    stream = await open_stream(good, params=params, headers=headers, status=status)
    body = await stream.response.json()
    assert body["reason"] == reason
    assert set(body) >= {"code", "reason", "reconnect"}


async def test_a_kick_is_an_alert_then_the_end(gateway: Gateway, open_stream: Open) -> None:
    stream = await open_stream(token("READER"))
    await _ready(gateway)
    await gateway.bow.disconnect(["READER"], "bye")
    event = await stream.next()
    assert event["event"] == "alert"
    assert json.loads(event["data"]) == {"code": 4005, "reason": "kicked", "text": "bye"}
    assert await stream.ended()
    await _until_streams(gateway, 0)


async def test_a_socketio_client_and_a_stream_get_the_same_messages_in_order(
    gateway: Gateway, open_stream: Open
) -> None:
    stream = await open_stream(token("READER", {"blogId": 42}))
    client = await gateway.connect("v1.3&proto=2")
    await client.authenticate_with_ack(token("OTHER", {"blogId": 42}))
    await _ready(gateway, 2)
    bodies = [{"name": f"m{n}", "n": n, "audience": BLOG_42} for n in range(5)]
    positions = [await push(gateway, body) for body in bodies]
    for body, position in zip(bodies, positions, strict=True):
        assert await stream.next() == {"id": position, "event": body["name"], "data": data(body)}
        event, payload = await client.next_event()
        assert (event, payload) == (body["name"], body)


async def test_the_token_is_never_logged(
    gateway: Gateway, open_stream: Open, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = token("READER")
    stream = await open_stream(params=[("token", secret)])
    await _ready(gateway)
    position = await push(gateway, {"name": "hello", "audience": [{"__id": "READER"}]})
    assert (await stream.next())["id"] == position
    refused = await open_stream(params=[("token", secret + "x")], status=401)
    await refused.response.read()
    stream.response.close()
    await _until_streams(gateway, 0)
    assert caplog.records
    for record in caplog.records:
        assert secret not in record.getMessage()


async def test_curl_receives_an_event(gateway: Gateway) -> None:
    curl = shutil.which("curl")
    assert curl is not None, "curl is missing: run tests/install-system-packages.sh"
    url = f"{gateway.url}/events?token={token('READER')}"
    process = await asyncio.create_subprocess_exec(curl, "-sN", url, stdout=asyncio.subprocess.PIPE)
    try:
        await _ready(gateway)
        body = {"name": "hi", "audience": [{"__id": "READER"}]}
        position = await push(gateway, body)
        assert process.stdout is not None
        lines = [await asyncio.wait_for(process.stdout.readline(), WAIT) for _ in range(3)]
        expected = [f"id: {position}\n", "event: hi\n", f"data: {data(body)}\n"]
        assert [line.decode() for line in lines] == expected
    finally:
        process.kill()
        await process.wait()


async def test_sse_path_none_turns_it_off(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> None:
    config = base_config(outbound={"timeout": 5, "sse_path": None})
    bow = await start_bow(standard_bow(config))
    url = f"http://127.0.0.1:{bow.port}/events?token={token('READER')}"
    async with http.get(url, headers=AUTH) as response:  # past the inbound's Basic Auth
        assert response.status == 404


async def _ready(gateway: Gateway, count: int = 1) -> None:
    """Until ``count`` connections are held in the index (a stream is, once it started)."""
    await _held(gateway.bow, count)


async def _until_streams(gateway: Gateway, count: int) -> None:
    outbound = gateway.bow._outbound
    assert outbound is not None
    for _ in range(int(WAIT / 0.01)):
        if len(outbound.connections) == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(outbound.connections)} connections left, not {count}")


# -- with settings of their own ----------------------------------------------------------------


async def started(start_bow: Callable[[Bow], Awaitable[Bow]], **outbound: Any) -> str:
    bow = await start_bow(standard_bow(base_config(outbound={"timeout": 5, **outbound})))
    return f"http://127.0.0.1:{bow.port}"


async def test_a_stream_ends_with_4003_at_exp_plus_grace(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> None:
    url = await started(start_bow, expiry_grace=0.2)
    expiring = mint("READER", SECRET, ttl=2)
    async with http.get(url + "/events", params={"token": expiring}) as response:
        stream = Stream(response)
        event = await stream.next(timeout=4)
        assert event["event"] == "alert"  # no 4100 first: a stream cannot re-authenticate
        assert json.loads(event["data"])["code"] == 4003
        assert await stream.ended()


async def test_only_listed_origins_get_access_control_allow_origin(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> None:
    app = "https://app.example.com"
    url = await started(start_bow, cors_origins=[app])
    for origin, allowed in ((app, app), ("https://evil.example.com", None)):
        headers = {"Origin": origin, "Authorization": f"Bearer {token('READER')}"}
        async with http.get(url + "/events", headers=headers) as response:
            assert response.status == 200
            assert response.headers.get("Access-Control-Allow-Origin") == allowed
    async with http.get(url + "/events", headers={"Origin": app}) as response:
        assert response.status == 401  # refusals carry it too, so that the page can read them
        assert response.headers.get("Access-Control-Allow-Origin") == app


async def test_over_max_sockets_is_503_with_retry_after(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> None:
    url = await started(start_bow, max_sockets=1)
    params = {"token": token("READER")}
    async with http.get(url + "/events", params=params) as first:
        assert first.status == 200
        async with http.get(url + "/events", params=params) as second:
            assert second.status == 503
            assert second.headers["Retry-After"] == "1"
            assert (await second.json())["reason"] == "too_many_requests"


async def test_a_stopping_instance_sends_4012_then_ends(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(standard_bow())
    url = f"http://127.0.0.1:{bow.port}/events"
    async with http.get(url, params={"token": token("READER")}) as response:
        stream = Stream(response)
        await _held(bow, 1)
        stopping = asyncio.ensure_future(bow.stop())
        event = await stream.next()
        assert (event["event"], json.loads(event["data"])["code"]) == ("alert", 4012)
        assert await stream.ended()
        await stopping


async def _held(bow: Bow, count: int) -> None:
    for _ in range(int(WAIT / 0.01)):
        if bow._outbound is not None and bow._outbound.listener_count() >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} listeners were not held in time")


async def test_a_stream_whose_client_stops_reading_is_closed_as_slow(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(
        standard_bow(base_config(outbound={"timeout": 5, "max_buffered_bytes": 65_536}))
    )
    _, writer = await asyncio.open_connection("127.0.0.1", bow.port)
    request = f"GET /events?token={token('READER')} HTTP/1.1\r\nHost: gateway\r\n\r\n"
    writer.write(request.encode())  # and never read again
    await _held(bow, 1)
    outbound = bow._outbound
    assert outbound is not None
    body = {"name": "big", "audience": [{"__id": "READER"}], "text": "x" * 16_384}
    url = f"http://127.0.0.1:{bow.port}{PATH}"
    for _ in range(200):
        async with http.post(url, json=body, headers=AUTH) as response:
            assert response.status == 204
        if not outbound.connections:
            break
        await asyncio.sleep(0.005)
    for _ in range(int(WAIT / 0.01)):
        if not outbound.connections:
            break
        await asyncio.sleep(0.01)
    assert not outbound.connections
    assert outbound.metrics.disconnects.labels("slow")._value.get() == 1
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def test_a_comment_line_keeps_a_quiet_stream_open(
    open_stream: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sse, "HEARTBEAT", 0.2)
    monkeypatch.setattr(sse, "SWEEP", 0.05)
    stream = await open_stream(token("READER"))
    line = await asyncio.wait_for(stream.response.content.readline(), WAIT)
    assert line == b":\n"


# -- hostile clients (issue 27) ------------------------------------------------------------------


def bow_url(bow: Bow) -> str:
    return f"http://127.0.0.1:{bow.port}"


async def _silent_stream(port: int, query: str) -> socket.socket:
    """A stream whose client never reads a byte, with a small receive buffer: what the gateway
    writes to it waits on the gateway's side."""
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(client, ("127.0.0.1", port))
    request = f"GET /events?{query} HTTP/1.1\r\nHost: gateway\r\n\r\n"
    await loop.sock_sendall(client, request.encode())
    return client


async def test_the_streams_of_one_id_that_stop_reading_are_bounded_together(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> None:
    # Regression: each of an id's streams could hold max_buffered_bytes (100 streams of one
    # token: +136 MB); their sum is now bounded by max_buffered_bytes_per_id (4008 past it).
    per_id, frame = 131_072, 8_192 + 256
    outbound_config = {"max_buffered_bytes": 262_144, "max_buffered_bytes_per_id": per_id}
    bow = await start_bow(standard_bow(base_config(outbound={"timeout": 5, **outbound_config})))
    outbound = bow._outbound
    assert outbound is not None
    clients = [await _silent_stream(bow.port, f"token={token('READER')}") for _ in range(4)]
    try:
        await until(lambda: sum(c.authenticated for c in outbound.connections.values()) == 4)
        body = {"name": "big", "audience": [{"__id": "READER"}], "text": "x" * 8_192}
        most = 0
        for _ in range(200):
            async with http.post(bow_url(bow) + PATH, json=body, headers=AUTH) as response:
                assert response.status == 204
            await asyncio.sleep(0.005)
            open_ = [c for c in outbound.connections.values() if c.closing is None]
            most = max(most, sum(outbound.writer.buffered(c) for c in open_))
            if not open_:
                break
        # what waits for the id's streams is never more than the bound and the last message
        # written to each (a write is checked before it is made)
        assert most <= per_id + 4 * frame, most
        assert outbound.metrics.disconnects.labels("slow")._value.get() >= 1
    finally:
        for client in clients:
            client.close()


async def test_anonymous_streams_past_max_anonymous_are_503_with_4009(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> None:
    config = base_config(outbound={"timeout": 5, "max_anonymous": 2})
    bow = await start_bow(p2_bow(config, anonymous_criteria={"public": True}))
    url = bow_url(bow) + "/events"
    async with http.get(url) as first, http.get(url) as second:
        assert (first.status, second.status) == (200, 200)
        async with http.get(url) as third:
            assert third.status == 503
            assert third.headers["Retry-After"] == "1"
            refused = await third.json()
            assert (refused["code"], refused["reason"]) == (4009, "too_many_sockets")
        async with http.get(url, params={"token": token("READER")}) as identified:
            assert identified.status == 200  # a listener with an id is not anonymous
    outbound = bow._outbound
    assert outbound is not None
    await until(lambda: not outbound.connections, "the streams to end")
    async with http.get(url) as again:
        assert again.status == 200  # the places of the streams that ended are free again


async def test_an_already_expired_token_is_401_with_4003(
    gateway: Gateway, open_stream: Open
) -> None:
    expired = mint("READER", SECRET, ttl=-10)
    stream = await open_stream(expired, status=401)
    refused = await stream.response.json()
    assert (refused["code"], refused["reason"]) == (4003, "token_expired")
    assert refused["reconnect"] == "new_token"


async def test_the_filters_of_sse_streams_count_toward_their_ids_bound(
    serve: Callable[[Bow], Awaitable[Gateway]],
) -> None:
    """Regression (issue 27): an SSE stream's filters escaped ``outbound.max_filters_per_id``,
    so each more stream of one token made the index hold 100 more filters."""
    config = base_config(outbound={"timeout": 5, "max_filters_per_id": 150})
    gateway = await serve(standard_bow(config))
    reader = token("READER", {"blogId": 42})

    async def open_with(topics: list[str]) -> aiohttp.ClientResponse:
        query = {"v": "v1.3"}
        return await gateway.http.get(
            gateway.url + "/events",
            params=[*query.items(), *(("topic", topic) for topic in topics)],
            headers={"Authorization": f"Bearer {reader}"},
        )

    first = await open_with([f"a/{k}" for k in range(100)])
    second = await open_with([f"a/{k}" for k in range(50, 150)])  # 50 new: 150 in all
    third = await open_with(["a/new"])
    try:
        assert (first.status, second.status) == (200, 200)
        assert third.status == 400
        refused = await third.json()
        assert "at most 150 distinct filters" in refused["text"], refused
        other = await gateway.http.get(
            gateway.url + "/events",
            params=[("v", "v1.3"), ("topic", "a/new")],
            headers={"Authorization": f"Bearer {token('OTHER')}"},
        )
        assert other.status == 200  # another id has its own
        other.close()
    finally:
        for response in (first, second, third):
            response.close()


async def test_last_event_id_recoveries_over_a_window_of_big_messages_stall_no_listener(
    serve: Callable[[Bow], Awaitable[Gateway]],
) -> None:
    """Four streams reconnect at once with a ``Last-Event-ID`` that predates 1,600 big messages
    (2,000 objects each to decode) none of which they may see: their recoveries take turns with
    the event loop (a few milliseconds at a time), so a stream pushed to every 20 ms meanwhile
    never waits 250 ms, and each recovers (no ``__gap``), nothing replayed. Guards against an
    unsliced scan: decoding the window in one step stalled every listener of the instance (some
    0.8 s here; seconds for thousands of 100-KB messages)."""
    gateway = await serve(standard_bow(base_config(recovery={"max_bytes": 64 << 20})))
    url = gateway.url + "/events"

    async def opened(listener_token: str, headers: dict[str, str] | None = None) -> Stream:
        response = await gateway.http.get(
            url, headers={"Authorization": f"Bearer {listener_token}", **(headers or {})}
        )
        assert response.status == 200, await response.text()
        streams.append(response)
        return Stream(response)

    streams: list[aiohttp.ClientResponse] = []
    try:
        honest = await opened(token("HONEST", {"blogId": 1}))
        reader = token("READER", {"blogId": 42})
        first = await opened(reader)
        await _ready(gateway, 2)
        seen = await push(gateway, {"name": "seen", "audience": BLOG_42})
        assert (await first.next())["id"] == seen
        first.response.close()
        await _until_streams(gateway, 1)
        payload = [{"k": i, "v": "x"} for i in range(2_000)]  # decoding each: some 0.5 ms
        sem = asyncio.Semaphore(8)

        async def push_big() -> None:
            async with sem:
                body = {"name": "big", "payload": payload, "audience": [{"blogId": 7}]}
                await push(gateway, body)

        await asyncio.gather(*(push_big() for _ in range(1_600)))
        settled = await push(gateway, {"name": "settled", "audience": [{"blogId": 1}]})
        assert (await honest.next())["id"] == settled  # the 1,600 are in the window
        stop = asyncio.Event()
        arrivals: list[float] = []
        loop = asyncio.get_running_loop()

        async def tick() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                await push(gateway, {"name": "tick", "n": n, "audience": [{"blogId": 1}]})
                await asyncio.sleep(0.02)

        async def listen() -> None:
            while True:  # until cancelled
                if (await honest.next(timeout=15.0)).get("event") == "tick":
                    arrivals.append(loop.time())

        # The cyclic collector off meanwhile, as in the Socket.IO long-recovery test: its full
        # collections of the 3.2 million objects decoded here take 50-400 ms each in this
        # process (`serve`'s gc_freeze keeps them off a gateway's hot path), a pause of the
        # interpreter, not of the recoveries under test.
        gc.disable()
        try:
            ticking, listening = asyncio.create_task(tick()), asyncio.create_task(listen())
            await asyncio.sleep(0.3)
            again = await asyncio.gather(
                *(opened(reader, {"Last-Event-ID": seen}) for _ in range(4))
            )
            # what is delivered during a recovery waits behind it: each stream's first event,
            # once its recovery is over
            sentinel = await push(gateway, {"name": "sentinel", "audience": BLOG_42})
            for stream in again:
                event = await stream.next(timeout=15.0)
                assert (event["id"], event["event"]) == (sentinel, "sentinel"), event
            await asyncio.sleep(0.3)
            stop.set()
            await ticking
            await asyncio.sleep(0.1)  # the last tick's arrival
            listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listening
        finally:
            gc.enable()
        gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
        longest = max(gaps, default=0.0)
        assert len(arrivals) > 10 and longest < 0.25, f"the listener waited {longest:.3f} s"
    finally:
        for response in streams:
            response.close()
