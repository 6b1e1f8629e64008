"""Basic Auth route by route (bow_gateway/ingress/inbound_auth.py): every route of the app,
whichever code path added it, refuses a request without the inbounds' credentials but the open
ones, and what no route takes is refused the same way before its 404 or 405."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from bow_gateway.inbounds.passthrough import create_message_from_request_body

from bow_gateway import Bow
from bow_gateway.ingress.inbound_auth import BasicAuth, FailedAttempts, client_address

from .support import AUTH, PASSWORD, PATH, REALM, USER, base_config, standard_bow

StartBow = Callable[[Bow], Awaitable[Bow]]

WRONG = {"Authorization": aiohttp.encode_basic_auth(USER, PASSWORD + "x")}
SOCKETIO = "/socket.io/"


def every_route_bow(config: dict[str, Any]) -> Bow:
    """The quick-start gateway with a parameterised inbound too: every kind of route."""
    return standard_bow(config).inbound(
        path="/api/message/{topic:.+}",
        create_message_from_request_body=create_message_from_request_body,
        middleware_version="v1.1",
    )


def app_of(bow: Bow) -> web.Application:
    return bow._runners[0].app  # the app as served


def concrete(route: web.AbstractRoute) -> str:
    """A path the route takes: its own, with "x" for each parameter ("/x" for the catch-all,
    which takes any)."""
    assert route.resource is not None
    info = route.resource.get_info()
    if not info:
        return "/x"
    return info.get("path") or re.sub(r"\{[^}]*\}", "x", info["formatter"])


@pytest.mark.parametrize("metrics_auth", [False, True])
async def test_every_route_refuses_without_credentials_but_the_open_ones(
    start_bow: StartBow, http: aiohttp.ClientSession, metrics_auth: bool
) -> None:
    bow = await start_bow(every_route_bow(base_config(metrics={"auth": metrics_auth})))
    url = f"http://127.0.0.1:{bow.port}"
    # named here, not taken from the gateway: /health, Socket.IO's, the clients' endpoints
    open_paths = {"/health", "/events", "/broker", "/gobbler", SOCKETIO}
    if not metrics_auth:
        open_paths.add("/metrics")
    routes = list(app_of(bow).router.routes())
    seen: set[tuple[str, str]] = set()
    for route in routes:
        path = concrete(route)
        methods = ["POST", "DELETE", "GET"] if route.method == "*" else [route.method]
        for method in methods:
            seen.add((method, path))
            for headers in ({}, WRONG):
                # a body that a handler reached without credentials would act on
                body = {"name": "x", "audience": [{"role": "admin"}], "ids": ["a"]}
                async with http.request(
                    method, url + path, json=body, headers=headers, allow_redirects=False
                ) as response:
                    challenge = response.headers.get("WWW-Authenticate")
                    if path in open_paths:  # its own answer (an SSE stream refuses no token)
                        assert challenge != f'Basic realm="{REALM}"', (method, path)
                    else:
                        assert response.status == 401, (method, path, response.status)
                        assert challenge == f'Basic realm="{REALM}"'
    # the walk covered every kind of route (a walk of nothing would prove nothing)
    paths = {path for _, path in seen}
    assert {"/v1.2/messages", "/api/message/x", "/_bow/criteria", "/_bow/disconnect"} <= paths
    assert {"/_bow/count", "/health", "/metrics", "/events", "/broker", "/gobbler"} <= paths
    assert {SOCKETIO, "/x"} <= paths and ("HEAD", "/health") in seen


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1.2/messages", 405),
        ("PUT", "/_bow/count", 405),
        ("POST", "/nowhere", 404),
        ("DELETE", "/api/message", 404),
        ("HEAD", "/socket.io/", 405),
    ],
)
async def test_what_no_route_takes_is_401_then_404_or_405(
    url: str, http: aiohttp.ClientSession, method: str, path: str, status: int
) -> None:
    async with http.request(method, url + path) as response:
        assert response.status == (status if path.startswith(SOCKETIO) else 401)
    async with http.request(method, url + path, headers=AUTH) as response:
        assert response.status == status
        if status == 405:
            assert response.headers["Allow"]


async def test_the_open_paths_stay_open_under_a_parameterised_inbound(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    """An inbound on every path takes the gateway's own paths too: as before, it answers 404
    on them without asking for credentials, and 401 anywhere else."""
    bow = await start_bow(
        Bow(base_config())
        .middleware(version="v1", create_criteria_from_listener_details=lambda d: {})
        .inbound(
            path="/{anything:.+}",
            create_message_from_request_body=create_message_from_request_body,
            middleware_version="v1",
        )
        .outbound(
            version="v1",
            create_listener_details_from_token=lambda t: {"id": t},
            middleware_version="v1",
        )
    )
    url = f"http://127.0.0.1:{bow.port}"
    async with http.post(url + "/health", json={}) as response:
        assert response.status == 404
    async with http.post(url + "/elsewhere", json={}) as response:
        assert response.status == 401
    body = {"name": "x", "audience": []}
    async with http.post(url + "/elsewhere", json=body, headers=AUTH) as response:
        assert response.status == 204


async def test_a_route_added_around_the_credentials_is_refused_at_start() -> None:
    auth = BasicAuth(realm="r", username="u", password="p", is_open=lambda path: False)
    app = web.Application()

    async def handler(request: web.Request) -> web.Response:
        return web.Response()

    auth.add(app, "GET", "/checked", handler)
    app.router.add_post("/unchecked", handler)
    with pytest.raises(RuntimeError, match="/unchecked"):
        auth.seal(app)
    with pytest.raises(RuntimeError, match="after the routes were sealed"):
        auth.add(app, "GET", "/late", handler)


async def test_a_request_for_no_path_at_all_is_401_too(url: str) -> None:
    """``OPTIONS *`` (a request-target that is not a path): no route's path can match it."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"OPTIONS * HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    status = await reader.readline()
    writer.close()
    assert status.startswith(b"HTTP/1.1 401 ")


# -- failed attempts, rate-limited per client address (issue 27) ---------------------------------


async def test_wrong_passwords_past_the_rate_are_429_then_every_request_of_the_address(
    start_bow: StartBow, caplog: pytest.LogCaptureFixture
) -> None:
    # Regression: 500 wrong passwords were answered 401 in 0.2 s, as many guesses.
    caplog.set_level(logging.DEBUG)
    inbound = {"realm": REALM, "username": USER, "password": PASSWORD}
    config = base_config(inbound={**inbound, "max_auth_failures_per_minute": 6})
    bow = await start_bow(standard_bow(config))
    url = f"http://127.0.0.1:{bow.port}{PATH}"
    body = {"name": "x", "audience": [{"role": "admin"}]}
    async with aiohttp.ClientSession() as http:
        for _ in range(
            100
        ):  # the credentials never count: a backend that has them is never limited
            async with http.post(url, json=body, headers=AUTH) as response:
                assert response.status == 204
        statuses = []
        for _ in range(100):
            async with http.post(url, json=body, headers=WRONG) as response:
                statuses.append(response.status)
                if response.status == 429:
                    retry_after = int(response.headers["Retry-After"])
                    assert 1 <= retry_after <= 10, retry_after
                    assert "WWW-Authenticate" not in response.headers
        assert statuses == [401] * 6 + [429] * 94
        async with http.post(url, json=body) as response:
            assert response.status == 429  # without credentials too, while blocked
    # the right credentials from that address, on a new connection: the fast path's plain JSON
    # POST, and aiohttp's (another content type), are refused as well until the block ends
    for content in ({"json": body}, {"data": b"{}", "headers": {"Content-Type": "text/plain"}}):
        async with aiohttp.ClientSession(headers=AUTH) as fresh:
            async with fresh.post(url, **content) as response:  # type: ignore[arg-type]
                assert response.status == 429 and "Retry-After" in response.headers
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{bow.port}/health") as response:
            assert response.status == 200  # open paths are not behind the credentials
    assert PASSWORD not in caplog.text
    assert AUTH["Authorization"] not in caplog.text and WRONG["Authorization"] not in caplog.text
    assert "127.0.0.1 blocked" in caplog.text


def test_a_block_ends_when_the_bucket_has_a_token_again(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    attempts = FailedAttempts(6)  # 6 at once, then one each 10 s
    assert [attempts.failed("10.0.0.1") for _ in range(6)] == [None] * 6
    assert attempts.failed("10.0.0.1") == pytest.approx(10.0)
    assert attempts.retry_after("10.0.0.1") == pytest.approx(10.0)
    assert attempts.retry_after("10.0.0.2") is None  # another address is not blocked
    now[0] += 10.5
    assert attempts.retry_after("10.0.0.1") is None
    assert not attempts.blocked  # dropped: requests are back to one test of an empty dict
    assert attempts.failed("10.0.0.1") is None  # one more guess, then blocked again
    assert attempts.failed("10.0.0.1") is not None


def test_addresses_are_keyed_by_host_and_ipv6_by_their_64() -> None:
    assert client_address(("192.0.2.7", 5000)) == "192.0.2.7"
    assert client_address(("::ffff:192.0.2.7", 5000, 0, 0)) == "192.0.2.7"
    one = client_address(("2001:db8:1:2::1", 5000, 0, 0))
    assert one == client_address(("2001:db8:1:2:ffff::9", 1, 0, 0)) == "2001:0db8:0001:0002"
    assert client_address(("2001:db8:1:3::1", 5000, 0, 0)) != one
    assert client_address("") == client_address(None) == ""  # a Unix socket's peer
