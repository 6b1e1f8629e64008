"""The inbounds' fast path: plain JSON POSTs answered without aiohttp's request machinery, any
other request handed to aiohttp on the same connection, with the same answers."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from bow_gateway import Bow

from .support import (
    AUTH,
    PASSWORD,
    PATH,
    REALM,
    USER,
    Listener,
    base_config,
    standard_bow,
    token,
)

StartBow = Callable[[Bow], Awaitable[Bow]]

MESSAGE = json.dumps({"name": "NEW_ARTICLE", "audience": [{"role": "admin"}]}).encode()


def post(body: bytes = MESSAGE, *, path: str = PATH, **headers: str) -> bytes:
    """A POST as a backend's HTTP client sends it; ``headers`` add to or replace the usual ones
    (``Content_Type`` for ``Content-Type``; an empty value drops the header)."""
    fields = {
        "Host": "127.0.0.1",
        "Content-Type": "application/json",
        "Authorization": AUTH["Authorization"],
        "Content-Length": str(len(body)),
    }
    fields.update({name.replace("_", "-"): value for name, value in headers.items()})
    head = "".join(f"{name}: {value}\r\n" for name, value in fields.items() if value)
    return f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + body


class Connection:
    """A raw HTTP/1.1 client connection: what is sent is sent as it is."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        """The next response: status, headers (lower-case names), body."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int((await self.reader.readline()).strip(), 16):
                body += await self.reader.readexactly(size + 2)
            await self.reader.readline()
        else:
            body = await self.reader.readexactly(length)
        return status, headers, body

    async def closed(self, within: float = 5.0) -> bool:
        """Whether the server closes the connection within ``within`` s."""
        try:
            return await asyncio.wait_for(self.reader.read(1), within) == b""
        except TimeoutError:
            return False


@pytest.fixture
async def gateway(start_bow: StartBow) -> Bow:
    return await start_bow(standard_bow())


@pytest.fixture
async def connect(gateway: Bow) -> AsyncIterator[Callable[[], Awaitable[Connection]]]:
    opened: list[Connection] = []

    async def open_one() -> Connection:
        connection = Connection(*await asyncio.open_connection("127.0.0.1", gateway.port))
        opened.append(connection)
        return connection

    yield open_one
    for connection in opened:
        connection.writer.close()


async def test_a_plain_json_post_is_answered_204_with_its_position_and_delivered(
    gateway: Bow, connect: Callable[[], Awaitable[Connection]]
) -> None:
    listener = Listener(f"http://127.0.0.1:{gateway.port}")
    await listener.connect()
    try:
        await listener.authenticate(token("USER/1", {"role": "admin"}))
        connection = await connect()
        await connection.send(post())
        status, headers, body = await connection.response()
        assert (status, body) == (204, b"")
        assert headers["bow-position"]
        assert "date" in headers and headers["server"].startswith("Python/")
        event, data = await listener.next_event()
        assert (event, data) == ("NEW_ARTICLE", json.loads(MESSAGE))
    finally:
        await listener.close()


async def test_pipelined_posts_are_answered_in_order(
    connect: Callable[[], Awaitable[Connection]],
) -> None:
    connection = await connect()
    await connection.send(post() * 5)
    positions = []
    for _ in range(5):
        status, headers, _ = await connection.response()
        assert status == 204
        positions.append(headers["bow-position"])
    assert len(set(positions)) == 5


async def test_a_post_that_arrives_in_pieces_is_answered(
    connect: Callable[[], Awaitable[Connection]],
) -> None:
    connection = await connect()
    request = post()
    for start in range(0, len(request), 7):
        await connection.send(request[start : start + 7])
        await asyncio.sleep(0.005)
    status, _, _ = await connection.response()
    assert status == 204


async def test_a_request_off_the_fast_path_is_answered_by_aiohttp_on_the_same_connection(
    connect: Callable[[], Awaitable[Connection]],
) -> None:
    connection = await connect()
    await connection.send(post())
    assert (await connection.response())[0] == 204
    await connection.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert (await connection.response())[0] == 200
    await connection.send(post())  # aiohttp's from now on, with the same answer
    status, headers, _ = await connection.response()
    assert status == 204 and headers["bow-position"]


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Basic " + base64.b64encode(f"{USER}:wrong".encode()).decode()},
        {"Authorization": ""},
    ],
    ids=["wrong-password", "none"],
)
async def test_other_credentials_get_aiohttps_401(
    connect: Callable[[], Awaitable[Connection]], headers: dict[str, str]
) -> None:
    connection = await connect()
    await connection.send(post())
    assert (await connection.response())[0] == 204
    await connection.send(post(**headers))
    status, response_headers, _ = await connection.response()
    assert status == 401
    assert response_headers["www-authenticate"].startswith("Basic realm=")


async def test_a_body_that_is_not_json_gets_422_saying_so_and_the_connection_stays_open(
    connect: Callable[[], Awaitable[Connection]],
) -> None:
    connection = await connect()
    await connection.send(post(b"{not json"))
    status, headers, body = await connection.response()
    assert status == 422
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert body.startswith(b"422: the body is not JSON")
    await connection.send(post())
    assert (await connection.response())[0] == 204


async def test_an_invalid_message_gets_the_same_422_on_either_path(
    connect: Callable[[], Awaitable[Connection]],
) -> None:
    invalid = json.dumps({"name": "x", "audience": "everyone"}).encode()
    fast = await connect()
    await fast.send(post(invalid))
    slow = await connect()
    await slow.send(post(invalid, Content_Type="application/json; charset=utf-8"))  # aiohttp's
    (fast_status, _, fast_body), (slow_status, _, slow_body) = (
        await fast.response(),
        await slow.response(),
    )
    assert (fast_status, fast_body) == (slow_status, slow_body)
    assert fast_status == 422 and b"audience" in fast_body


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Content_Length": "5, 5"}, 400),
        ({"Content_Type": "text/plain"}, 422),
        ({"Connection": "close"}, 204),
        ({"Expect": "100-continue"}, 204),
    ],
    ids=["odd-content-length", "not-json", "connection-close", "expect"],
)
async def test_unusual_requests_get_aiohttps_answer(
    connect: Callable[[], Awaitable[Connection]], headers: dict[str, str], status: int
) -> None:
    connection = await connect()
    await connection.send(post(**headers))
    got = await connection.response()
    if got[0] == 100:  # Expect: 100-continue
        got = await connection.response()
    assert got[0] == status


async def test_a_chunked_body_is_accepted(connect: Callable[[], Awaitable[Connection]]) -> None:
    connection = await connect()
    chunked = f"{len(MESSAGE):x}\r\n".encode() + MESSAGE + b"\r\n0\r\n\r\n"
    await connection.send(post(chunked, Content_Length="", Transfer_Encoding="chunked"))
    assert (await connection.response())[0] == 204


async def test_a_body_over_max_body_size_gets_413(start_bow: StartBow) -> None:
    bow = await start_bow(
        standard_bow(
            base_config(
                inbound={
                    "realm": REALM,
                    "username": USER,
                    "password": PASSWORD,
                    "max_body_size": 1_000,
                }
            )
        )
    )
    connection = Connection(*await asyncio.open_connection("127.0.0.1", bow.port))
    try:
        await connection.send(post(b" " * 2_000 + MESSAGE))
        assert (await connection.response())[0] == 413
    finally:
        connection.writer.close()


async def test_an_idle_connection_is_closed_after_http_timeout(start_bow: StartBow) -> None:
    bow = await start_bow(standard_bow(base_config(http_timeout=0.5)))
    connection = Connection(*await asyncio.open_connection("127.0.0.1", bow.port))
    try:
        await connection.send(post())
        assert (await connection.response())[0] == 204
        assert await connection.closed(within=3)
    finally:
        connection.writer.close()


async def test_an_idle_connection_is_closed_when_its_keep_alive_time_is_up_not_later(
    start_bow: StartBow,
) -> None:
    """Regression: closing idle connections up to a second late (a sweep once a second) had a
    backend's pooled connection, idle for ~10.5 s, closed under its next POST (lost replies)."""
    bow = await start_bow(standard_bow(base_config(http_timeout=2.0)))
    connection = Connection(*await asyncio.open_connection("127.0.0.1", bow.port))
    try:
        await connection.send(post())
        assert (await connection.response())[0] == 204
        answered = asyncio.get_running_loop().time()
        assert not await connection.closed(within=1.7)
        assert await connection.closed(within=0.8)
        assert asyncio.get_running_loop().time() - answered < 2.5
    finally:
        connection.writer.close()


async def test_a_request_whose_head_stalls_is_cut_after_http_timeout(
    start_bow: StartBow,
) -> None:
    bow = await start_bow(standard_bow(base_config(http_timeout=0.5)))
    connection = Connection(*await asyncio.open_connection("127.0.0.1", bow.port))
    try:
        await connection.send(post())
        assert (await connection.response())[0] == 204
        await connection.send(post()[:30])  # the rest of its head never comes
        assert await connection.closed(within=3)
    finally:
        connection.writer.close()


async def test_a_stopping_gateway_closes_its_idle_connections(start_bow: StartBow) -> None:
    bow = await start_bow(standard_bow())
    connection = Connection(*await asyncio.open_connection("127.0.0.1", bow.port))
    try:
        await connection.send(post())
        assert (await connection.response())[0] == 204
        await bow.stop()
        assert await connection.closed(within=3)
    finally:
        connection.writer.close()


async def test_one_bad_connection_does_not_disturb_another(
    connect: Callable[[], Awaitable[Connection]],
) -> None:
    bad, good = await connect(), await connect()
    await bad.send(b"POST " + PATH.encode() + b" HTTP/1.1\r\nContent-Length: x\x00\r\n\r\n")
    await good.send(post())
    assert (await good.response())[0] == 204
    status, _, _ = await bad.response()
    assert status == 400
    await good.send(post())
    assert (await good.response())[0] == 204


async def test_plain_posts_stay_on_the_fast_path_until_another_request_comes(
    gateway: Bow, connect: Callable[[], Awaitable[Connection]]
) -> None:
    fast_path = gateway._fast_paths[0][0]
    connection = await connect()
    for _ in range(3):
        await connection.send(post())
        assert (await connection.response())[0] == 204
        assert len(fast_path.connections) == 1
    await connection.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert (await connection.response())[0] == 200
    assert not fast_path.connections  # aiohttp's now


async def test_blanks_around_header_values_are_not_part_of_them(
    gateway: Bow, connect: Callable[[], Awaitable[Connection]]
) -> None:
    """RFC 9112's optional whitespace around a field value is not part of it: the request stays
    on the fast path, its credentials, length and type read without the blanks."""
    fast_path = gateway._fast_paths[0][0]
    connection = await connect()
    await connection.send(
        post(
            Content_Type=" \tapplication/json \t",
            Authorization=f"  {AUTH['Authorization']}\t ",
            Content_Length=f"{len(MESSAGE)}  ",
            Connection="keep-alive\t",
        )
    )
    assert (await connection.response())[0] == 204
    assert len(fast_path.connections) == 1  # answered on the fast path, still its


async def test_a_length_with_more_than_blanks_around_it_is_aiohttps_to_refuse(
    gateway: Bow, connect: Callable[[], Awaitable[Connection]]
) -> None:
    fast_path = gateway._fast_paths[0][0]
    connection = await connect()
    await connection.send(post(Content_Length=f" {len(MESSAGE)} x"))
    assert (await connection.response())[0] == 400
    assert not fast_path.connections
