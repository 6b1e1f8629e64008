"""Inbounds that take the whole request (``create_message_from_request``) on paths with parameters
(``clients.md`` section 14), against a real gateway on a free port over real HTTP; registration
from Python and from a TOML file."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound

from bow_gateway import Bow, InboundRequest
from bow_gateway.app.standalone import build_bow, load_settings
from bow_gateway.cli.serve import tour

from .support import AUTH, SECRET, base_config
from .support.protocol2 import Listener

ROUTE = "/api/message/{topic:.+}"
AUDIENCE = [{"role": "admin"}]
StartBow = Callable[[Bow], Awaitable[Bow]]


class Recorder:
    """A ``create_message_from_request``: keeps each request; answers what ``reply`` makes."""

    def __init__(self) -> None:
        self.requests: list[InboundRequest] = []
        self.reply: Callable[[InboundRequest], Any] = lambda request: {
            "name": "seen",
            "payload": dict(request.match_info),
            "audience": AUDIENCE,
        }

    def __call__(self, request: InboundRequest) -> Any:
        self.requests.append(request)
        return self.reply(request)


def request_bow(function: Any, path: str = ROUTE, **config: Any) -> Bow:
    return (
        Bow(base_config(**config))
        .middleware(version="v1", create_criteria_from_listener_details=criteria_from_claim())
        .inbound(path=path, create_message_from_request=function, middleware_version="v1")
        .outbound(
            version="v1.3",
            create_listener_details_from_token=JwtOutbound(secret=SECRET),
            middleware_version="v1",
        )
    )


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def url(start_bow: StartBow, recorder: Recorder) -> str:
    bow = await start_bow(request_bow(recorder))
    return f"http://127.0.0.1:{bow.port}"


Post = Callable[..., Awaitable[tuple[int, str]]]


@pytest.fixture
def post(http: aiohttp.ClientSession, url: str) -> Post:
    """``status, text = await post(path, data=..., headers=...)``, with the credentials."""

    async def send(path: str, **kwargs: Any) -> tuple[int, str]:
        headers = {**AUTH, **kwargs.pop("headers", {})}
        async with http.post(url + path, headers=headers, **kwargs) as response:
            return response.status, await response.text()

    return send


@pytest.fixture
async def listener(url: str) -> AsyncIterator[Listener]:
    made = await Listener().connect(url)
    yield made
    await made.client.disconnect()


async def test_path_parameters_reach_the_function_decoded(post: Post, recorder: Recorder) -> None:
    assert await post("/api/message/chat/room%201", data=b"x") == (204, "")
    [request] = recorder.requests
    assert dict(request.match_info) == {"topic": "chat/room 1"}
    assert request.path == "/api/message/chat/room 1"


async def test_the_query_and_the_headers_reach_the_function_with_names_as_sent(
    post: Post, recorder: Recorder
) -> None:
    status, _ = await post(
        "/api/message/t?userId=marvin&tag=a&tag=b", data=b"x", headers={"X-Gobbler-Key": "V"}
    )
    assert status == 204
    [request] = recorder.requests
    assert request.query["userId"] == "marvin" and request.query.getall("tag") == ["a", "b"]
    assert request.headers["x-gobbler-key"] == "V"
    assert "X-Gobbler-Key" in list(request.headers.keys())


async def test_the_raw_body_and_its_content_type_reach_the_function_unparsed(
    post: Post, recorder: Recorder
) -> None:
    body = b"\xff not JSON, not text"
    headers = {"Content-Type": "Text/Plain; charset=latin-1"}
    assert await post("/api/message/t", data=body, headers=headers) == (204, "")
    [request] = recorder.requests
    assert (request.body, request.content_type, request.charset) == (body, "text/plain", "latin-1")


async def test_a_request_without_body_reaches_the_function_with_an_empty_one(
    post: Post, recorder: Recorder
) -> None:
    assert await post("/api/message/t") == (204, "")
    assert recorder.requests[0].body == b""


async def test_the_message_it_returns_reaches_the_audience(post: Post, listener: Listener) -> None:
    assert await post("/api/message/chat/room1", data=b"x") == (204, "")
    name, (data, meta) = await listener.next()
    assert (name, data) == ("seen", {"topic": "chat/room1"})
    assert meta["position"]


async def test_a_list_it_returns_is_a_batch_delivered_in_order(
    post: Post, recorder: Recorder, listener: Listener
) -> None:
    recorder.reply = lambda request: [
        {"name": word, "audience": AUDIENCE} for word in request.body.decode().split()
    ]
    assert await post("/api/message/t", data=b"one two three") == (204, "")
    assert [(await listener.next())[0] for _ in range(3)] == ["one", "two", "three"]


async def test_a_function_that_raises_gets_422_with_its_reason(
    post: Post, recorder: Recorder
) -> None:
    def refuse(request: InboundRequest) -> Any:
        raise ValueError("no such topic")

    recorder.reply = refuse
    assert await post("/api/message/t", data=b"x") == (
        422,
        "422: the request was refused: no such topic",
    )


async def test_an_invalid_message_it_returns_gets_422_naming_the_field(
    post: Post, recorder: Recorder
) -> None:
    recorder.reply = lambda request: {"name": "n", "audience": [], "headers": {"Key": 1}}
    status, text = await post("/api/message/t", data=b"x")
    assert (status, text) == (422, "422: invalid message: headers.Key: must be a string, not int")


async def test_credentials_come_first_on_a_path_with_parameters(
    http: aiohttp.ClientSession, url: str, recorder: Recorder
) -> None:
    async with http.post(url + "/api/message/t", data=b"x") as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Basic realm=")
    assert not recorder.requests


async def test_another_method_gets_405_and_a_path_the_route_does_not_match_404(
    http: aiohttp.ClientSession, url: str
) -> None:
    async with http.get(url + "/api/message/t", headers=AUTH) as response:
        assert response.status == 405
    async with http.post(url + "/api/message/", headers=AUTH, data=b"x") as response:
        assert response.status == 404  # {topic:.+} needs at least one character


async def test_a_body_over_max_body_size_gets_413(
    start_bow: StartBow, http: aiohttp.ClientSession, recorder: Recorder
) -> None:
    config = base_config()
    inbound = {**config["inbound"], "max_body_size": 1_000}
    bow = await start_bow(request_bow(recorder, inbound=inbound))
    target = f"http://127.0.0.1:{bow.port}/api/message/t"
    async with http.post(target, headers=AUTH, data=b"x" * 1_001) as response:
        assert response.status == 413
    assert not recorder.requests


async def test_a_body_that_stops_arriving_gets_408_after_inbound_timeout(
    start_bow: StartBow, recorder: Recorder
) -> None:
    config = base_config()
    bow = await start_bow(request_bow(recorder, inbound={**config["inbound"], "timeout": 0.3}))
    reader, writer = await asyncio.open_connection("127.0.0.1", bow.port)
    try:
        writer.write(
            f"POST /api/message/t HTTP/1.1\r\nHost: gateway\r\nAuthorization: "
            f"{AUTH['Authorization']}\r\nContent-Length: 100\r\n\r\nten bytes.".encode()
        )
        status = await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()
    assert status.startswith(b"HTTP/1.1 408 ")
    assert not recorder.requests


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site", "Origin": "http://app.example"},
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
    ],
)
async def test_a_request_a_browser_sent_from_another_site_gets_422(
    post: Post, recorder: Recorder, headers: dict[str, str]
) -> None:
    status, text = await post("/api/message/t", data=b"x", headers=headers)
    assert status == 422
    assert "from a page of another site" in text and "cross-site request forgery" in text, text
    assert not recorder.requests


async def test_a_browser_request_from_the_gateway_s_own_origin_is_taken(
    post: Post, url: str, recorder: Recorder
) -> None:
    headers = {"Origin": url, "Sec-Fetch-Site": "same-origin"}
    assert await post("/api/message/t", data=b"x", headers=headers) == (204, "")
    status, _ = await post("/api/message/t", data=b"x", headers={"Origin": url})
    assert status == 204


async def test_a_catch_all_path_never_takes_the_gateway_s_own_paths(
    start_bow: StartBow, http: aiohttp.ClientSession, recorder: Recorder
) -> None:
    bow = await start_bow(request_bow(recorder, path="/{anything:.+}"))
    base = f"http://127.0.0.1:{bow.port}"
    for path in ("/socket.io/x", "/events", "/health"):  # open: no credentials asked
        async with http.post(base + path, data=b"x") as response:
            assert response.status == 404, path
    async with http.post(base + "/_bow/other", headers=AUTH, data=b"x") as response:
        assert response.status == 404
    async with http.post(base + "/anything/else", headers=AUTH, data=b"x") as response:
        assert response.status == 204
    assert [request.path for request in recorder.requests] == ["/anything/else"]


def message_function(body: Any) -> Any:
    return body


@pytest.mark.parametrize(
    "functions",
    [
        {},
        {
            "create_message_from_request_body": message_function,
            "create_message_from_request": Recorder(),
        },
    ],
)
def test_an_inbound_needs_exactly_one_of_the_two_functions(functions: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="give exactly one of create_message_from_request_body"):
        Bow(base_config()).inbound(path="/in", middleware_version="v1", **functions)


def test_a_request_function_that_is_not_callable_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="create_message_from_request must be callable"):
        Bow(base_config()).inbound(
            path="/in", create_message_from_request="nope", middleware_version="v1"
        )


@pytest.mark.parametrize("path", ["/api/{topic:[}", "/api/{", "/api/{a}/{a}"])
def test_a_path_aiohttp_cannot_route_is_a_value_error_at_registration(path: str) -> None:
    with pytest.raises(ValueError, match="is not a valid route"):
        Bow(base_config()).inbound(
            path=path, create_message_from_request=Recorder(), middleware_version="v1"
        )


TOML = """
port = 0
host = "127.0.0.1"
[inbound]
realm = "r"
username = "u"
password = "a-password-of-our-own"
[outbound]
timeout = 5
[[middlewares]]
version = "v1"
create_criteria_from_listener_details = "bow_gateway.middlewares.claims:criteria_from_claim"
[[inbounds]]
path = "/api/message/{{topic:.+}}"
{functions}
middleware_version = "v1"
"""
GOBBLER = (
    'create_message_from_request = "bow_gateway.inbounds.gobbler:GobblerInbound"\n'
    'options = { audience = [{ role = "admin" }] }'
)
PASSTHROUGH = (
    "create_message_from_request_body = "
    '"bow_gateway.inbounds.passthrough:create_message_from_request_body"'
)


async def test_an_inbounds_table_may_name_create_message_from_request(
    tmp_path: Path, start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(TOML.format(functions=GOBBLER))
    bow = await start_bow(build_bow(load_settings(str(config))))
    auth = {"Authorization": aiohttp.encode_basic_auth("u", "a-password-of-our-own")}
    target = f"http://127.0.0.1:{bow.port}/api/message/foo"
    async with http.post(target, headers=auth, data=b"Hello") as response:
        assert response.status == 204, await response.text()


@pytest.mark.parametrize("functions", ["", f"{GOBBLER}\n{PASSTHROUGH}"])
def test_an_inbounds_table_with_neither_or_both_functions_is_refused_naming_it(
    tmp_path: Path, functions: str
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(TOML.format(functions=functions))
    with pytest.raises(ValueError, match=r"\[\[inbounds\]\] #1: give exactly one of"):
        load_settings(str(config))


def test_serve_s_tour_shows_the_json_example_on_a_json_inbound(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        TOML.format(functions=GOBBLER)
        + f'[[inbounds]]\npath = "/v1/json"\n{PASSTHROUGH}\nmiddleware_version = "v1"\n'
        + '[[outbounds]]\nversion = "v1"\nmiddleware_version = "v1"\n'
        + 'create_listener_details_from_token = "bow_gateway.outbounds.jwt:JwtOutbound"\n'
        + f'options = {{ secret = "{SECRET}" }}\n'
    )
    settings = load_settings(str(config))
    text = tour(build_bow(settings), settings)
    assert "push:   POST http://127.0.0.1:None/api/message/{topic:.+}" in text
    [curl] = [line for line in text.splitlines() if line.strip().startswith("curl -i ")]
    assert curl.endswith("/v1/json") and "application/json" in curl
