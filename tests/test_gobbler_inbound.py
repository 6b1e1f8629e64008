"""The bundled Gobbler REST inbound (``clients.md`` section 14): ``POST /api/message/{topic}``
against real gateways on free ports, over real HTTP, to real python-socketio protocol-2 clients;
its headers and publisher ids through a private redis-server's stream to a second instance."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio
from bow_gateway.inbounds.gobbler import GobblerInbound

from bow_gateway import Bow
from bow_gateway.core.message import MessageEvent, decode_event
from bow_gateway.core.publication import Publication

from .support import AUTH
from .support.gobbler_inbound import gobbler_bow
from .support.protocol2 import Listener
from .support.redis_server import RedisServer

STREAM = "{bow}:events"  # RedisBackplane.key in the default namespace
FORM = {"Content-Type": "application/x-www-form-urlencoded"}  # what `curl --data` sends
StartBow = Callable[[Bow], Awaitable[Bow]]


class Seen:
    """An enricher of every message that keeps what it receives, and returns it unchanged."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def __call__(self, message: dict[str, Any]) -> dict[str, Any]:
        self.messages.append(dict(message))
        return message


@pytest.fixture
def seen() -> Seen:
    return Seen()


@pytest.fixture
async def url(start_bow: StartBow, seen: Seen) -> str:
    bow = await start_bow(gobbler_bow().enricher(filter="#", enrich=seen))
    return f"http://127.0.0.1:{bow.port}"


Post = Callable[..., Awaitable[tuple[int, str]]]


@pytest.fixture
def post(http: aiohttp.ClientSession, url: str) -> Post:
    """``status, text = await post(path, body, headers)``, with the credentials, as a form."""

    async def send(
        path: str, body: bytes = b"Hello", headers: dict[str, str] | None = None
    ) -> tuple[int, str]:
        sent = {**AUTH, **FORM, **(headers or {})}
        async with http.post(url + path, data=body, headers=sent) as response:
            return response.status, await response.text()

    return send


@pytest.fixture
async def listener(url: str) -> AsyncIterator[Listener]:
    made = await Listener().connect(url)
    yield made
    await made.client.disconnect()


async def test_a_rest_publish_reaches_a_socket_as_the_topic_path_with_the_body_as_payload(
    post: Post, listener: Listener
) -> None:
    assert await post("/api/message/foo?userId=marvin&messageId=42") == (204, "")
    name, (payload, meta) = await listener.next()
    assert (name, payload) == ("/foo", "Hello")
    assert meta["position"]


async def test_a_subtopic_keeps_its_levels_in_the_path(post: Post, listener: Listener) -> None:
    assert await post("/api/message/chat/room1", "héllo".encode()) == (204, "")
    name, (payload, _) = await listener.next()
    assert (name, payload) == ("/chat/room1", "héllo")


async def test_x_gobbler_headers_become_the_message_s_headers_prefix_removed_case_kept(
    post: Post, seen: Seen
) -> None:
    headers = {"X-Gobbler-Key": "Value", "x-gobbler-trace-ID": "7", "X-Other": "no"}
    assert await post("/api/message/foo", headers=headers) == (204, "")
    [message] = seen.messages
    assert message["headers"] == {"Key": "Value", "trace-ID": "7"}


async def test_user_id_and_message_id_come_from_the_query(post: Post, seen: Seen) -> None:
    assert await post("/api/message/foo?userId=marvin&messageId=42") == (204, "")
    assert await post("/api/message/foo?userId=&other=1") == (204, "")
    first, second = seen.messages
    assert (first["user_id"], first["message_id"]) == ("marvin", "42")
    assert not {"user_id", "message_id", "headers"} & second.keys()


async def test_an_enricher_s_returned_mapping_keeps_them(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    def shout(message: dict[str, Any]) -> dict[str, Any]:
        message["payload"] = message["payload"].upper()
        return message

    after = Seen()
    bow = await start_bow(
        gobbler_bow().enricher(filter="#", enrich=shout).enricher(filter="#", enrich=after)
    )
    target = f"http://127.0.0.1:{bow.port}/api/message/foo?userId=marvin"
    headers = {**AUTH, "X-Gobbler-Key": "Value"}
    async with http.post(target, data=b"Hello", headers=headers) as response:
        assert response.status == 204
    [message] = after.messages
    assert (message["payload"], message["headers"], message["user_id"]) == (
        "HELLO",
        {"Key": "Value"},
        "marvin",
    )


async def test_a_body_that_is_not_utf8_is_refused_with_422(post: Post) -> None:
    status, text = await post("/api/message/foo", b"\xff\xfe")
    assert status == 422
    assert text.startswith("422: the request was refused: the body is not UTF-8 text"), text


@pytest.mark.parametrize(
    ("path", "headers", "error"),
    [
        (
            "/api/message/foo",
            {f"X-Gobbler-H{n}": "v" for n in range(65)},
            "invalid message: headers: at most 64 headers, not 65",
        ),
        (
            "/api/message/foo",
            {"X-Gobbler-A": "a" * 5_000, "X-Gobbler-B": "b" * 5_000},
            "invalid message: headers: at most 8192 bytes of names and values (UTF-8), not 10002",
        ),
        (
            "/api/message/foo?userId=a,b",
            {},
            "invalid message: user_id: must not hold a comma or a line break",
        ),
        (
            "/api/message/foo?messageId=" + "9" * 257,
            {},
            "invalid message: message_id: at most 256 characters, not 257",
        ),
    ],
    ids=["65-headers", "10-kb-of-headers", "comma-in-user-id", "long-message-id"],
)
async def test_bad_headers_or_ids_are_refused_with_422_naming_the_field(
    post: Post, listener: Listener, path: str, headers: dict[str, str], error: str
) -> None:
    status, text = await post(path, headers=headers)
    assert status == 422
    assert text.startswith(f"422: {error}"), text
    assert await post("/api/message/after") == (204, "")
    assert (await listener.next())[0] == "/after"  # nothing of the refused ones came first


async def test_a_path_without_a_topic_parameter_is_refused_naming_it(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(gobbler_bow(path="/api/message/{name}"))
    target = f"http://127.0.0.1:{bow.port}/api/message/foo"
    async with http.post(target, data=b"Hello", headers=AUTH) as response:
        assert response.status == 422
        assert "the inbound's path has no {topic} parameter" in await response.text()


@pytest.mark.parametrize(
    ("audience", "error"),
    [([{}], "audience.0: a query needs at least one predicate"), ("admins", "a list of queries")],
)
def test_a_bad_audience_is_a_value_error_at_construction(audience: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        GobblerInbound(audience=audience)


# -- through Redis ---------------------------------------------------------------------------


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


async def test_headers_and_ids_survive_a_trip_through_a_redis_backplane(
    start_bow: StartBow, http: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    publisher = await start_bow(gobbler_bow(redis=redis_server.url))
    receiver = await start_bow(gobbler_bow(redis=redis_server.url))
    listener = await Listener().connect(f"http://127.0.0.1:{receiver.port}")
    try:
        target = f"http://127.0.0.1:{publisher.port}/api/message/foo?userId=marvin&messageId=42"
        headers = {**AUTH, **FORM, "X-Gobbler-Key": "Value"}
        async with http.post(target, data=b"Hello", headers=headers) as response:
            assert response.status == 204, await response.text()
            position = response.headers["Bow-Position"]
        name, (payload, meta) = await listener.next()
        assert (name, payload, meta["position"]) == ("/foo", "Hello", position)
    finally:
        await listener.client.disconnect()
    event = await stream_event(redis_server.url, position)
    assert isinstance(event, MessageEvent)
    assert event.message.publication == Publication({"Key": "Value"}, "marvin", None, "42")


async def stream_event(url: str, position: str) -> Any:
    """The event at ``position`` in the gateway's Redis stream, as every instance decodes it."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        entries = await client.xrange(STREAM)
    finally:
        await client.aclose()
    found = [data[b"d"] for entry_id, data in entries if position.endswith(f".{entry_id.decode()}")]
    assert len(found) == 1, (position, entries)
    return decode_event(found[0])


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/api/message/foo%00", "invalid message: name: '/foo\\x00' must not hold a comma"),
        ("/api/message/foo%E2%80%AE", "invalid message: name: '/foo\\u202e' must not hold"),
        ("/api/message/foo/", "invalid message: name: '/foo/' has an empty level"),
        ("/api/message/chat//room1", "invalid message: name: '/chat//room1' has an empty level"),
        ("/api/message/foo?userId=%E2%80%AEnimda", "invalid message: user_id: must not hold"),
        ("/api/message/foo?messageId=1%0D%0A2", "invalid message: message_id: must not hold"),
    ],
    ids=["nul", "rtl-override", "trailing-slash", "empty-level", "rtl-user-id", "crlf-id"],
)
async def test_names_and_ids_that_could_forge_a_field_are_refused_with_422(
    post: Post, listener: Listener, path: str, error: str
) -> None:
    status, text = await post(path)
    assert status == 422
    assert text.startswith(f"422: {error}"), text
    assert await post("/api/message/after") == (204, "")
    assert (await listener.next())[0] == "/after"  # nothing of the refused ones came first
