"""Contract section 2: the HTTP inbound and /health, against a real server over real HTTP."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from bow_gateway import Bow

from .support import AUTH, PASSWORD, PATH, REALM, USER, Listener, base_config, standard_bow
from .support.redis_server import RedisServer

Push = Callable[..., Awaitable[aiohttp.ClientResponse]]
StartBow = Callable[[Bow], Awaitable[Bow]]

MESSAGE = {"name": "NEW_ARTICLE", "audience": [{"role": "admin"}]}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": aiohttp.encode_basic_auth(user, password)}


async def test_accepted_message_answers_204_and_reaches_the_listener(
    push: Push, listeners: Callable[..., Awaitable[Listener]]
) -> None:
    admin = await listeners("USER/1", {"role": "admin"})
    response = await push({**MESSAGE, "title": "Hello"})
    assert response.status == 204
    event, data = await admin.next_event()
    assert event == "NEW_ARTICLE"
    assert data == {**MESSAGE, "title": "Hello"}


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", PATH), ("GET", PATH), ("POST", "/unknown"), ("DELETE", "/v1.2/other")],
)
async def test_no_credentials_get_401_with_the_realm_whatever_the_path(
    http: aiohttp.ClientSession, url: str, method: str, path: str
) -> None:
    async with http.request(method, url + path, json=MESSAGE) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == f'Basic realm="{REALM}"'


@pytest.mark.parametrize(
    "headers",
    [
        basic(USER, "wrong"),
        basic("wrong", PASSWORD),
        basic(USER, PASSWORD + "x"),
        {"Authorization": "Basic not-base64!"},
        {"Authorization": "Bearer " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()},
        {"Authorization": "Basic " + base64.b64encode(USER.encode()).decode()},
    ],
    ids=["wrong-password", "wrong-user", "longer-password", "bad-base64", "bearer", "no-colon"],
)
async def test_wrong_credentials_get_401(push: Push, headers: dict[str, str]) -> None:
    response = await push(MESSAGE, headers=headers)
    assert response.status == 401
    assert response.headers["WWW-Authenticate"] == f'Basic realm="{REALM}"'


async def test_realm_with_quotes_is_escaped_in_the_challenge(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    config = base_config(inbound={"realm": 'My "big" platform', "username": "u", "password": "p"})
    bow = await start_bow(standard_bow(config))
    async with http.post(f"http://127.0.0.1:{bow.port}{PATH}", json=MESSAGE) as response:
        assert response.headers["WWW-Authenticate"] == 'Basic realm="My \\"big\\" platform"'


async def test_unknown_path_with_credentials_gets_404(push: Push) -> None:
    assert (await push(MESSAGE, path="/v9/messages")).status == 404


async def test_other_method_on_an_inbound_path_gets_405(
    http: aiohttp.ClientSession, url: str
) -> None:
    async with http.get(url + PATH, headers=AUTH) as response:
        assert response.status == 405
        assert "POST" in response.headers["Allow"]


async def test_body_over_the_configured_limit_gets_413(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    config = base_config()
    config["inbound"] = {**config["inbound"], "max_body_size": 1_000}
    bow = await start_bow(standard_bow(config))
    body = {**MESSAGE, "padding": "x" * 2_000}
    async with http.post(f"http://127.0.0.1:{bow.port}{PATH}", json=body, headers=AUTH) as response:
        assert response.status == 413


async def test_body_just_under_the_limit_is_accepted(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    config = base_config()
    config["inbound"] = {**config["inbound"], "max_body_size": 1_000}
    bow = await start_bow(standard_bow(config))
    async with http.post(
        f"http://127.0.0.1:{bow.port}{PATH}", json={**MESSAGE, "padding": "x" * 800}, headers=AUTH
    ) as response:
        assert response.status == 204


async def test_no_body_gets_422(http: aiohttp.ClientSession, url: str) -> None:
    async with http.post(url + PATH, headers=AUTH) as response:
        assert response.status == 422
        assert "no body" in await response.text()


@pytest.mark.parametrize("body", [b"{not json", b"NaN", b'{"name": Infinity}', b"\xff\xfe"])
async def test_body_that_is_not_json_gets_422(
    http: aiohttp.ClientSession, url: str, body: bytes
) -> None:
    headers = {**AUTH, "Content-Type": "application/json"}
    async with http.post(url + PATH, data=body, headers=headers) as response:
        assert response.status == 422
        assert "not JSON" in await response.text()


async def test_message_function_that_raises_gets_422_with_its_reason(push: Push) -> None:
    response = await push({"audience": []})  # the pass-through inbound needs a name
    assert response.status == 422
    assert "'name'" in await response.text()


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"name": "", "audience": []}, "name"),
        ({"name": 42, "audience": []}, "name"),
        ({"name": "X", "audience": {"role": "admin"}}, "audience"),
        ({"name": "X", "audience": [{}]}, "audience.0"),
        ({"name": "X", "audience": [{"role": "admin"}, {}]}, "audience.1"),
        ({"name": "X", "audience": [{"role": ""}]}, "audience.0.role"),
        ({"name": "X", "audience": [{"role": None}]}, "audience.0.role"),
        ({"name": "X", "audience": [{"role": ["admin"]}]}, "audience.0.role"),
        ({"name": "X", "audience": [{"role": {"in": "admin"}}]}, "audience.0.role"),
        ({"name": "X", "audience": ["admin"]}, "audience.0"),
    ],
)
async def test_invalid_message_gets_422_naming_the_field(
    start_bow: StartBow, http: aiohttp.ClientSession, message: dict[str, Any], field: str
) -> None:
    bow = await start_bow(
        Bow(base_config())
        .middleware(version="1", create_criteria_from_listener_details=lambda details: {})
        .inbound(
            path=PATH, create_message_from_request_body=lambda body: body, middleware_version="1"
        )
    )
    async with http.post(
        f"http://127.0.0.1:{bow.port}{PATH}", json=message, headers=AUTH
    ) as response:
        assert response.status == 422
        assert f"{field}:" in await response.text()


async def test_a_payload_json_cannot_hold_gets_422_not_500(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    # Regression: a message_fn returning a set as payload made the encoding fail after
    # validation, and the request got 500.
    bow = await start_bow(
        Bow(base_config())
        .middleware(version="1", create_criteria_from_listener_details=lambda details: {})
        .inbound(
            path="/in",
            create_message_from_request_body=lambda body: {
                "name": "X",
                "payload": {1, 2},
                "audience": [],
            },
            middleware_version="1",
        )
    )
    async with http.post(f"http://127.0.0.1:{bow.port}/in", json={}, headers=AUTH) as response:
        assert response.status == 422
        assert "payload" in await response.text()


@pytest.mark.parametrize("body", [b"NaN", b'{"x": Infinity}', b'{"x": 1e400}'])
async def test_json_that_is_not_strict_json_gets_422(
    http: aiohttp.ClientSession, url: str, body: bytes
) -> None:
    headers = {**AUTH, "Content-Type": "application/json"}
    async with http.post(url + PATH, data=body, headers=headers) as response:
        assert response.status == 422
        assert "not JSON" in await response.text()


async def test_empty_audience_is_accepted(push: Push) -> None:
    assert (await push({"name": "X", "audience": []})).status == 204


async def test_message_function_may_be_a_coroutine(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    async def create(body: Any) -> Any:
        await asyncio.sleep(0)
        return {"name": body["kind"], "payload": body["data"], "audience": []}

    bow = await start_bow(
        Bow(base_config())
        .middleware(version="1", create_criteria_from_listener_details=lambda details: {})
        .inbound(path="/in", create_message_from_request_body=create, middleware_version="1")
    )
    body = {"kind": "PING", "data": 1}
    async with http.post(f"http://127.0.0.1:{bow.port}/in", json=body, headers=AUTH) as response:
        assert response.status == 204


async def test_hanging_message_function_is_bounded_and_answers_503(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    async def hang(body: Any) -> Any:
        await asyncio.sleep(60)

    config = base_config()
    config["inbound"] = {**config["inbound"], "timeout": 0.2}
    bow = await start_bow(
        Bow(config)
        .middleware(version="1", create_criteria_from_listener_details=lambda details: {})
        .inbound(path="/in", create_message_from_request_body=hang, middleware_version="1")
    )
    async with http.post(f"http://127.0.0.1:{bow.port}/in", json={}, headers=AUTH) as response:
        assert response.status == 503
        assert "Retry-After" in response.headers


async def test_health_answers_200_with_an_empty_body_without_credentials(
    http: aiohttp.ClientSession, url: str
) -> None:
    async with http.get(url + "/health") as response:
        assert response.status == 200
        assert await response.read() == b""


async def test_health_check_decorator_may_return_a_json_value(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(standard_bow().health_check(lambda request: {"status": "ok"}))
    async with http.get(f"http://127.0.0.1:{bow.port}/health") as response:
        assert response.status == 200
        assert await response.json() == {"status": "ok"}


async def test_health_check_decorator_may_return_a_response(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    async def decorate(request: web.Request) -> web.Response:
        return web.Response(text="fine", headers={"X-Version": "1"})

    bow = await start_bow(standard_bow().health_check(decorate))
    async with http.get(f"http://127.0.0.1:{bow.port}/health") as response:
        assert response.status == 200
        assert await response.text() == "fine"
        assert response.headers["X-Version"] == "1"


async def test_health_is_503_once_the_instance_stops_serving(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(standard_bow())
    backplane = bow._backplane
    assert backplane is not None
    await backplane.disconnect()  # as when Redis becomes unreachable
    async with http.get(f"http://127.0.0.1:{bow.port}/health") as response:
        assert response.status == 503
    async with http.post(
        f"http://127.0.0.1:{bow.port}{PATH}", json=MESSAGE, headers=AUTH
    ) as response:
        assert response.status == 503
        assert "Retry-After" in response.headers


# -- hostile bodies: bounded audiences, JSON only, reserved names, nothing internal ------------


def json_headers(content_type: str = "application/json") -> dict[str, str]:
    return {**AUTH, "Content-Type": content_type}


async def test_an_audience_over_max_queries_gets_a_short_422(
    http: aiohttp.ClientSession, url: str
) -> None:
    body = orjson.dumps({"name": "X", "audience": [{}] * 349_000})  # 1 MB: 30 MB of errors before
    async with http.post(url + PATH, data=body, headers=json_headers()) as response:
        assert response.status == 422
        text = await response.text()
    assert "audience: at most 1000 queries, not 349000" in text
    assert len(text) < 4_096


async def test_an_audience_over_max_queries_is_refused_without_walking_it(
    http: aiohttp.ClientSession, url: str
) -> None:
    body = orjson.dumps({"name": "X", "audience": [{}] * 349_000})
    started = time.perf_counter()
    async with http.post(url + PATH, data=body, headers=json_headers()) as response:
        assert response.status == 422
    assert time.perf_counter() - started < 1.0  # 3.4 s of validation before


async def test_the_refusal_of_a_huge_audience_is_logged_on_a_short_line(
    http: aiohttp.ClientSession, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = orjson.dumps({"name": "X", "audience": [{"k": None}] * 1_000})
    with caplog.at_level(logging.INFO, logger="bow_gateway.inbound"):
        async with http.post(url + PATH, data=body, headers=json_headers()) as response:
            assert response.status == 422
    refusals = [record.getMessage() for record in caplog.records if "refused" in record.msg]
    assert refusals and all(len(line) < 4_096 for line in refusals)
    assert "audience.0.k:" in refusals[0] and "faulty queries" in refusals[0]


async def test_a_query_over_max_predicates_gets_422(push: Push) -> None:
    query = {f"key{number}": number for number in range(33)}
    response = await push({"name": "X", "audience": [{"role": "admin"}, query]})
    assert response.status == 422


async def test_the_audience_bounds_are_configurable(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    config = base_config()
    config["inbound"] = {**config["inbound"], "max_queries": 2, "max_predicates": 1}
    bow = await start_bow(standard_bow(config))
    target = f"http://127.0.0.1:{bow.port}{PATH}"
    for audience, status in [
        ([{"a": 1}, {"b": 2}], 204),
        ([{"a": 1}, {"b": 2}, {"c": 3}], 422),
        ([{"a": 1, "b": 2}], 422),
    ]:
        body = {"name": "X", "audience": audience}
        async with http.post(target, json=body, headers=AUTH) as response:
            assert response.status == status, audience


@pytest.mark.parametrize(
    "name",
    [
        "connect",
        "connect_error",
        "disconnect",
        "disconnecting",
        "newListener",
        "removeListener",
        "alert",
    ],
)
async def test_a_message_named_as_a_client_event_gets_422(push: Push, name: str) -> None:
    response = await push({"name": name, "audience": [{"role": "admin"}]})
    assert response.status == 422
    assert f"name: {name!r} is reserved" in await response.text()


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/octet-stream",
        "text/json",
        "application/jsonp",
    ],
)
async def test_a_json_body_sent_as_another_content_type_gets_422(
    http: aiohttp.ClientSession, url: str, content_type: str
) -> None:
    body = orjson.dumps(MESSAGE)  # what a cross-site form can be made to send
    async with http.post(url + PATH, data=body, headers=json_headers(content_type)) as response:
        assert response.status == 422
        assert "application/json" in await response.text()


async def test_a_json_body_without_content_type_gets_422(
    http: aiohttp.ClientSession, url: str
) -> None:
    async with http.post(
        url + PATH, data=orjson.dumps(MESSAGE), headers=AUTH, skip_auto_headers=["Content-Type"]
    ) as response:
        assert response.status == 422
        assert "no Content-Type" in await response.text()


@pytest.mark.parametrize(
    "content_type",
    ["application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"],
)
async def test_json_content_types_with_parameters_or_a_json_suffix_are_accepted(
    http: aiohttp.ClientSession, url: str, content_type: str
) -> None:
    body = orjson.dumps(MESSAGE)
    async with http.post(url + PATH, data=body, headers=json_headers(content_type)) as response:
        assert response.status == 204


async def test_a_compressed_body_that_does_not_decode_gets_400(
    http: aiohttp.ClientSession, url: str
) -> None:
    headers = {**json_headers(), "Content-Encoding": "gzip"}
    async with http.post(url + PATH, data=b"not gzip at all", headers=headers) as response:
        assert response.status == 400
        assert "Content-Encoding" in await response.text()


async def test_a_503_body_does_not_name_the_redis_address(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    with RedisServer() as redis_server:
        config = base_config(redis=redis_server.url, backplane={"connect_retries": 0})
        bow = await start_bow(standard_bow(config))
        redis_server.stop()
        for _ in range(3):  # whether the gateway has noticed the loss yet or not
            async with http.post(
                f"http://127.0.0.1:{bow.port}{PATH}", json=MESSAGE, headers=AUTH
            ) as response:
                assert response.status == 503
                assert "Retry-After" in response.headers
                text = await response.text()
            assert "127.0.0.1" not in text and str(redis_server.port) not in text
            assert "cannot take messages now" in text


async def test_a_failing_health_check_does_not_tell_its_error(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    def check(request: web.Request) -> Any:
        raise ConnectionError("cannot reach the database at 10.1.2.3:5432")

    bow = await start_bow(standard_bow().health_check(check))
    async with http.get(f"http://127.0.0.1:{bow.port}/health") as response:
        assert response.status == 503
        assert "10.1.2.3" not in await response.text()


# -- protocol 2: event size, gateway names, positions -------------------------------------------


def sized_bow(max_event_bytes: int) -> Bow:
    """An inbound whose message is ``{"name": "X", "payload": body["p"]}`` (no payload without
    ``p``): the event is ``["X","<p>"]``, 8 bytes more than ``p``."""
    config = base_config()
    config["outbound"] = {**config["outbound"], "max_event_bytes": max_event_bytes}

    def create(body: Any) -> Any:
        message = {"name": body.get("name", "X"), "audience": []}
        return {**message, "payload": body["p"]} if "p" in body else message

    return (
        Bow(config)
        .middleware(version="1", create_criteria_from_listener_details=lambda details: {})
        .inbound(path="/in", create_message_from_request_body=create, middleware_version="1")
    )


async def test_an_event_at_max_event_bytes_is_accepted_and_one_byte_more_gets_413(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(sized_bow(1_000))
    target = f"http://127.0.0.1:{bow.port}/in"
    async with http.post(target, json={"p": "é" * 496}, headers=AUTH) as response:
        assert response.status == 204  # 992 UTF-8 bytes of payload: exactly 1,000
    async with http.post(target, json={"p": "x" * 993}, headers=AUTH) as response:
        assert response.status == 413
        text = await response.text()
    assert "1001 bytes" in text and "outbound.max_event_bytes (1000)" in text


async def test_an_event_without_payload_is_measured_as_name_alone(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(sized_bow(64))
    target = f"http://127.0.0.1:{bow.port}/in"
    async with http.post(target, json={"name": "n" * 60}, headers=AUTH) as response:
        assert response.status == 204  # ["nnn...n"]: 64 bytes
    async with http.post(target, json={"name": "n" * 61}, headers=AUTH) as response:
        assert response.status == 413


@pytest.mark.parametrize("name", ["__x", "__position", "__gap", "__", "__disconnect_"])
async def test_a_name_starting_with_two_underscores_gets_422(push: Push, name: str) -> None:
    response = await push({"name": name, "audience": [{"role": "admin"}]})
    assert response.status == 422
    text = await response.text()
    assert f"name: {name!r} is reserved" in text and "__disconnect" in text


async def test_disconnect_is_the_one_gateway_name_a_message_may_use(push: Push) -> None:
    assert (await push({"name": "__disconnect", "audience": []})).status == 204


async def test_an_accepted_message_answers_204_with_its_position(push: Push) -> None:
    response = await push(MESSAGE)
    assert response.status == 204
    assert "Bow-Position" in response.headers


@pytest.mark.parametrize("path", ["/_bow", "/_bow/count", "/_bow/v1/messages"])
def test_an_inbound_path_under_the_control_prefix_is_a_value_error(path: str) -> None:
    with pytest.raises(ValueError, match=r"under api\.prefix '/_bow'"):
        standard_bow().inbound(
            path=path, create_message_from_request_body=lambda b: b, middleware_version="v1.1"
        )


# -- names that could forge a frame (issue 27) -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("news\nevent: alert", "must not hold a comma or a line break"),  # SSE's lines
        ("news\r\ndata: forged", "must not hold a comma or a line break"),
        ("/chat/room1,7,ADMIN", "must not hold a comma"),  # Gobbler's first line
        ("news\u202e", "nor a control or bidirectional character"),
        ("news\x00", "nor a control or bidirectional character"),
        ("news\u2028", "nor a control or bidirectional character"),
        ("news/", "has an empty level"),
        ("news//fx", "has an empty level"),
        ("news/#", "has a + or # level"),
    ],
)
async def test_a_name_that_could_forge_a_frame_gets_422(
    push: Push, listeners: Callable[..., Awaitable[Listener]], name: str, why: str
) -> None:
    admin = await listeners("USER/1", {"role": "admin"})
    response = await push({"name": name, "audience": [{"role": "admin"}]})
    assert response.status == 422
    text = await response.text()
    assert text.startswith(f"422: invalid message: name: {name!r}") and why in text, text
    assert (await push(MESSAGE)).status == 204
    assert (await admin.next_event())[0] == "NEW_ARTICLE"  # nothing of the refused one first


async def test_a_batch_with_a_forging_name_is_refused_whole_naming_its_index(push: Push) -> None:
    batch = [MESSAGE, {"name": "a,b", "audience": []}]
    response = await push(batch)
    assert response.status == 422
    assert (await response.text()).startswith("422: invalid message: 1.name: 'a,b' must not")


@pytest.mark.parametrize(
    "name", ["user joined", "Grüße/日本語", "/chat/room1", "family/👨\u200d👩\u200d👧", "a#b"]
)
async def test_names_with_spaces_letters_and_a_leading_slash_stay_valid(
    push: Push, listeners: Callable[..., Awaitable[Listener]], name: str
) -> None:
    admin = await listeners("USER/1", {"role": "admin"})
    assert (await push({"name": name, "audience": [{"role": "admin"}]})).status == 204
    assert (await admin.next_event())[0] == name
