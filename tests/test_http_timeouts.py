"""Slow HTTP clients (slowloris) against a real gateway, over raw sockets: a request's headers and
its body must arrive in bounded time; WebSockets and long-polling GETs are never cut for it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from bow_gateway import Bow

from .support import AUTH, PATH, Listener, base_config, standard_bow, token

StartBow = Callable[[Bow], Awaitable[Bow]]
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]

TIMEOUT = 0.5  # http_timeout and inbound.timeout of these gateways
AUTHORIZATION = f"Authorization: {AUTH['Authorization']}\r\n"
# An inbound POST announcing 1000 bytes of body and sending 10 of them.
STALLED_BODY = (
    f"POST {PATH} HTTP/1.1\r\nHost: gateway\r\n{AUTHORIZATION}"
    'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"name": '
).encode()


@pytest.fixture
async def bow(start_bow: StartBow) -> Bow:
    config = base_config(http_timeout=TIMEOUT)
    config["inbound"] = {**config["inbound"], "timeout": TIMEOUT}
    return await start_bow(standard_bow(config))


@pytest.fixture
async def connect(bow: Bow) -> AsyncIterator[Callable[[], Awaitable[Connection]]]:
    """Raw TCP connections to the gateway, closed at the end."""
    opened: list[asyncio.StreamWriter] = []

    async def open_one() -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", bow.port)
        opened.append(writer)
        return reader, writer

    yield open_one
    for writer in opened:
        writer.close()


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """True once the gateway has closed the connection (what it answered first is read and
    dropped); False if it is still open after ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


async def trickle(writer: asyncio.StreamWriter, data: bytes, interval: float) -> None:
    """Send ``data`` one byte every ``interval`` seconds, until the gateway hangs up."""
    try:
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(interval)
    except ConnectionError:
        pass


async def test_a_connection_that_sends_nothing_is_closed(
    connect: Callable[[], Awaitable[Connection]],
) -> None:
    reader, _ = await connect()
    assert await closed_within(reader, 3)


async def test_headers_that_never_end_are_cut(
    connect: Callable[[], Awaitable[Connection]],
) -> None:
    reader, writer = await connect()
    writer.write(f"POST {PATH} HTTP/1.1\r\nHost: gateway\r\n{AUTHORIZATION}".encode())
    assert await closed_within(reader, 3)


async def test_headers_sent_a_byte_at_a_time_are_cut(
    connect: Callable[[], Awaitable[Connection]],
) -> None:
    reader, writer = await connect()
    headers = f"GET /health HTTP/1.1\r\nHost: gateway\r\nX-Slow: {'x' * 200}\r\n\r\n".encode()
    sender = asyncio.create_task(trickle(writer, headers, interval=0.05))  # 11 s in all
    try:
        assert await closed_within(reader, 3)
    finally:
        sender.cancel()


async def test_an_inbound_body_that_stops_arriving_gets_408(
    connect: Callable[[], Awaitable[Connection]],
) -> None:
    reader, writer = await connect()
    writer.write(STALLED_BODY)
    status = await asyncio.wait_for(reader.readline(), 3)
    assert status.startswith(b"HTTP/1.1 408 ")


async def test_the_connection_of_a_body_that_stops_arriving_is_closed(
    connect: Callable[[], Awaitable[Connection]],
) -> None:
    reader, writer = await connect()
    writer.write(STALLED_BODY)
    assert await closed_within(reader, 4)


async def test_a_polling_post_whose_body_never_arrives_closes_its_session_without_traceback(
    bow: Bow, connect: Callable[[], Awaitable[Connection]], caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://127.0.0.1:{bow.port}/socket.io/?EIO=4&transport=polling&v=v1.3"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        opened = await response.text()
    sid = json.loads(opened[1:])["sid"]  # "0{...}": the Engine.IO open packet
    reader, writer = await connect()
    writer.write(
        f"POST /socket.io/?EIO=4&transport=polling&v=v1.3&sid={sid} HTTP/1.1\r\n"
        "Host: gateway\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n".encode()
    )
    status = await asyncio.wait_for(reader.readline(), 3)
    assert status.startswith(b"HTTP/1.1 400 ")  # engineio's answer to a broken session
    async with aiohttp.ClientSession() as http, http.get(url + f"&sid={sid}") as response:
        assert response.status == 400  # the session is gone
    assert not [record for record in caplog.records if record.exc_info]


@pytest.mark.parametrize("transport", ["polling", "websocket"])
async def test_a_listener_idle_for_longer_than_the_bound_is_not_cut(
    bow: Bow, http: aiohttp.ClientSession, transport: str
) -> None:
    url = f"http://127.0.0.1:{bow.port}"
    listener = Listener(url)
    try:
        await listener.connect(transports=[transport])
        await listener.authenticate(token("USER/1", {"role": "admin"}))
        await asyncio.sleep(4 * TIMEOUT)  # a long-poll GET held open, or a quiet WebSocket
        body = {"name": "LATE", "audience": [{"role": "admin"}]}
        async with http.post(url + PATH, json=body, headers=AUTH) as response:
            assert response.status == 204
        assert (await listener.next_event())[0] == "LATE"
        assert not listener.disconnected.is_set()
    finally:
        await bow.stop()  # first: a polling client's own disconnect waits for its next ping
        await listener.close()


# -- handshakes: bounded for the whole instance -------------------------------------------------

HANDSHAKE = "/socket.io/?EIO=4&transport=polling&v=1.3"


async def handshake(http: aiohttp.ClientSession, url: str) -> aiohttp.ClientResponse:
    async with http.get(url + HANDSHAKE) as response:
        await response.read()
        return response


async def test_a_handshake_past_max_sockets_gets_503_with_retry_after(start_bow: StartBow) -> None:
    bow = await start_bow(standard_bow(base_config(outbound={"timeout": 5, "max_sockets": 2})))
    url = f"http://127.0.0.1:{bow.port}"
    async with aiohttp.ClientSession() as http:
        assert [(await handshake(http, url)).status for _ in range(2)] == [200, 200]
        refused = await handshake(http, url)
        assert refused.status == 503 and refused.headers["Retry-After"] == "1"
        assert "2 connections are open" in await refused.text()


async def test_handshakes_past_max_connects_per_second_get_503(start_bow: StartBow) -> None:
    config = base_config(outbound={"timeout": 5, "max_connects_per_second": 5})
    bow = await start_bow(standard_bow(config))
    url = f"http://127.0.0.1:{bow.port}"
    async with aiohttp.ClientSession() as http:
        responses = await asyncio.gather(*(handshake(http, url) for _ in range(30)))
        statuses = [response.status for response in responses]
        # a burst of twice the rate at once, then 2 s of turns (MAX_WAIT); the rest refused
        assert 20 <= statuses.count(200) <= 22 and statuses.count(503) == 30 - statuses.count(200)
        refused = next(response for response in responses if response.status == 503)
        assert refused.headers["Retry-After"] == "1"
        assert "over 5 new connections a second" in await refused.text()
        assert (await handshake(http, url)).status == 200  # its turn is within 2 s again


async def test_a_herd_of_handshakes_past_the_rate_waits_its_turn(start_bow: StartBow) -> None:
    # Regression: 10,000 sockets connecting at once, 200 at a time, were refused past
    # max_connects_per_second (500) and its burst: 6,120 of 10,000 failed (bow-compare).
    config = base_config(outbound={"timeout": 5, "max_connects_per_second": 20})
    bow = await start_bow(standard_bow(config))
    url = f"http://127.0.0.1:{bow.port}"
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as http:
        began = loop.time()
        responses = await asyncio.gather(*(handshake(http, url) for _ in range(70)))
        statuses = [response.status for response in responses]
        took = loop.time() - began
    assert statuses == [200] * 70
    assert took >= 1.3  # 40 at once (the burst), 30 more at 20 a second
