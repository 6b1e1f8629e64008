"""Contract section 9: the control endpoints' HTTP side and Bow's coroutines, on a real server.

What sockets do with the events (4005, new criteria, a count's answer) is the outbound's and is
tested there; here: credentials, methods, validation, limits, and the events published.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow
from bow_gateway.backplanes import MemoryBackplane
from bow_gateway.core.message import (
    CountEvent,
    Event,
    KickEvent,
    SetCriteriaEvent,
    count_answer,
    decode_event,
)
from bow_gateway.ingress.control import check_changes, check_count, check_kick, summed

from .support import AUTH, PATH, REALM, base_config, standard_bow
from .support.redis_server import RedisServer

StartBow = Callable[[Bow], Awaitable[Bow]]

CRITERIA = "/_bow/criteria"
DISCONNECT = "/_bow/disconnect"
COUNT = "/_bow/count"


class Recording(MemoryBackplane):
    """The in-process backplane, keeping what was published; it answers counts with ``canned``."""

    def __init__(self, canned: list[bytes] | None = None, complete: bool = True) -> None:
        super().__init__()
        self.published: list[Event] = []
        self.canned = canned or []
        self.complete = complete

    async def publish(self, data: bytes) -> Any:  # the position, once backplanes give one
        position = await super().publish(data)
        self.published.append(decode_event(data))
        return position

    async def answers(
        self, request_id: str, publish: Callable[[], Awaitable[str]], timeout: float
    ) -> tuple[list[bytes], bool]:
        await publish()
        return self.canned, self.complete


async def started(
    start_bow: StartBow, backplane: Recording | None = None, **api: Any
) -> tuple[str, Recording]:
    backplane = backplane or Recording()
    bow = await start_bow(standard_bow(base_config(api=api), backplane))
    return f"http://127.0.0.1:{bow.port}", backplane


async def post(
    http: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, str, dict[str, str]]:
    async with http.post(url, json=body, headers=AUTH if headers is None else headers) as response:
        return response.status, await response.text(), dict(response.headers)


# -- credentials, methods ---------------------------------------------------------------------


@pytest.mark.parametrize("path", [CRITERIA, DISCONNECT, COUNT])
@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_no_credentials_get_401_with_the_realm(
    http: aiohttp.ClientSession, url: str, path: str, method: str
) -> None:
    async with http.request(method, url + path, json={"ids": ["a"]}) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == f'Basic realm="{REALM}"'


@pytest.mark.parametrize("path", [CRITERIA, DISCONNECT, COUNT])
async def test_other_methods_get_405(http: aiohttp.ClientSession, url: str, path: str) -> None:
    for method in ("GET", "PUT", "DELETE"):
        async with http.request(method, url + path, headers=AUTH) as response:
            assert response.status == 405
            assert "POST" in response.headers["Allow"]


async def test_the_prefix_is_configurable(start_bow: StartBow, http: aiohttp.ClientSession) -> None:
    url, backplane = await started(start_bow, prefix="/admin/bow")
    status, _, _ = await post(http, url + "/admin/bow/disconnect", {"ids": ["a"]})
    assert status == 204
    assert (await post(http, url + DISCONNECT, {"ids": ["a"]}))[0] == 404
    assert backplane.published == [KickEvent(["a"], "", "new_token")]


# -- POST /_bow/criteria ------------------------------------------------------------------------


async def test_criteria_are_published_with_the_id_kept(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    url, backplane = await started(start_bow)
    body = [{"id": "u1", "criteria": {"role": "admin"}}, {"id": 7, "criteria": {}}]
    assert (await post(http, url + CRITERIA, body))[0] == 204
    single = {"id": "u2", "criteria": {"__id": "u2", "teams": [1, 2]}}
    assert (await post(http, url + CRITERIA, single))[0] == 204
    assert backplane.published == [
        SetCriteriaEvent([("u1", {"role": "admin", "__id": "u1"}), (7, {"__id": 7})]),
        SetCriteriaEvent([("u2", {"__id": "u2", "teams": [1, 2]})]),
    ]


async def test_a_batch_with_one_bad_entry_gets_422_naming_its_index_and_nothing_applies(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    url, backplane = await started(start_bow)
    body = [{"id": f"u{n}", "criteria": {"role": "admin"}} for n in range(5)]
    body[3]["criteria"] = {"role": ""}
    status, text, _ = await post(http, url + CRITERIA, body)
    assert status == 422
    assert "3.criteria.role:" in text
    assert backplane.published == []


async def test_a_batch_over_max_batch_gets_422(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    url, backplane = await started(start_bow, max_batch=2)
    body = [{"id": f"u{n}", "criteria": {}} for n in range(3)]
    status, text, _ = await post(http, url + CRITERIA, body)
    assert (status, "at most 2 entries" in text) == (422, True)
    assert (await post(http, url + CRITERIA, body[:2]))[0] == 204
    assert len(backplane.published) == 1


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"id": "u1", "criteria": {"__id": "u2"}}, "criteria.__id: must be the id"),
        ({"id": "u1", "criteria": {"__id": True}}, "criteria.__id: must be the id"),
        ({"id": "", "criteria": {}}, "id: must be a number or a non-empty string"),
        ({"id": True, "criteria": {}}, "id: must be a number"),
        ({"criteria": {}}, "id: Missing data"),
        ({"id": "u1"}, "criteria: Missing data"),
        ({"id": "u1", "criteria": {"a": None}}, "criteria.a:"),
        ({"id": "u1", "criteria": {}, "extra": 1}, "extra: Unknown field"),
        ([{"id": "u1", "criteria": {}}, "x"], "1: Invalid input type"),
        ("u1", "the body must be"),
    ],
)
def test_criteria_bodies_are_checked_naming_the_field(body: Any, words: str) -> None:
    with pytest.raises(ValueError) as error:
        check_changes(body)
    assert words in str(error.value)


def test_an_id_given_as_its_own_criterion_is_kept() -> None:
    assert check_changes({"id": 1, "criteria": {"__id": 1.0}}) == [(1, {"__id": 1})]


# -- POST /_bow/disconnect ----------------------------------------------------------------------


async def test_a_kick_is_published_with_its_reason_and_advice(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    url, backplane = await started(start_bow)
    body = {"ids": ["u1", 2], "reason": "account closed", "reconnect": "never"}
    assert (await post(http, url + DISCONNECT, body))[0] == 204
    assert (await post(http, url + DISCONNECT, {"ids": ["u3"]}))[0] == 204
    assert backplane.published == [
        KickEvent(["u1", 2], "account closed", "never"),
        KickEvent(["u3"], "", "new_token"),
    ]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"ids": ["a"], "reconnect": "later"}, "reconnect: must be one of now, backoff"),
        ({"ids": ["a"], "reason": "x" * 257}, "reason: at most 256 characters"),
        ({"ids": ["a", ""]}, "ids.1: must be"),
        ({"ids": "a"}, "ids: Not a valid list"),
        ({}, "ids: Missing data"),
        ({"ids": ["a"], "why": "x"}, "why: Unknown field"),
        (["a"], "the body must be"),
    ],
)
async def test_a_bad_kick_gets_422_naming_the_field(
    start_bow: StartBow, http: aiohttp.ClientSession, body: Any, words: str
) -> None:
    url, backplane = await started(start_bow)
    status, text, _ = await post(http, url + DISCONNECT, body)
    assert status == 422
    assert words in text
    assert backplane.published == []


def test_a_kick_of_more_ids_than_max_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="ids: at most 2"):
        check_kick({"ids": ["a", "b", "c"]}, max_batch=2)


# -- POST /_bow/count -------------------------------------------------------------------------


async def test_count_sums_the_instances_answers(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    canned = [count_answer((3, {"a", "b"}), 10), count_answer((1, {"b"}), 10)]
    url, backplane = await started(start_bow, Recording(canned))
    audience = [{"role": "admin"}]
    status, text, _ = await post(http, url + COUNT, {"audience": audience})
    assert status == 200, text
    async with http.post(url + COUNT, json={"audience": audience}, headers=AUTH) as response:
        assert await response.json() == {"sockets": 4, "listeners": 2, "complete": True}
    [first, second] = backplane.published
    assert isinstance(first, CountEvent) and isinstance(second, CountEvent)
    assert first.audience == audience and first.request_id != second.request_id


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"audience": [{}]}, "audience.0:"),
        ({"audience": [{"role": "admin"}, {"role": None}]}, "audience.1.role:"),
        ({}, "audience: Missing data"),
        ({"audience": [], "x": 1}, "x: Unknown field"),
    ],
)
async def test_a_bad_count_gets_422_naming_the_field(
    start_bow: StartBow, http: aiohttp.ClientSession, body: Any, words: str
) -> None:
    url, backplane = await started(start_bow)
    status, text, _ = await post(http, url + COUNT, body)
    assert (status, words in text) == (422, True), text
    assert backplane.published == []


async def test_counts_over_the_rate_get_429_with_retry_after(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    url, _ = await started(start_bow, max_counts_per_second=0.5)
    assert (await post(http, url + COUNT, {"audience": []}))[0] == 200
    status, text, headers = await post(http, url + COUNT, {"audience": []})
    assert status == 429
    assert headers["Retry-After"] == "2"
    assert "api.max_counts_per_second" in text


def test_answers_over_count_max_ids_or_unreadable_are_said_so() -> None:
    answers = [count_answer((2, {"a", "b"}), 1), count_answer((1, {"c"}), 1)]
    assert summed(answers, True, 10) == {"sockets": 3, "listeners": None, "complete": True}
    answers = [count_answer((2, {"a", "b"}), 5), count_answer((2, {"c", 4}), 5)]
    assert summed(answers, True, 3) == {"sockets": 4, "listeners": None, "complete": True}
    assert summed([b"{", b'{"sockets": 1}'], True, 3) == {
        "sockets": 0,
        "listeners": 0,
        "complete": False,
    }
    assert summed([], False, 3) == {"sockets": 0, "listeners": 0, "complete": False}


def test_a_count_audience_is_checked_as_a_message_s() -> None:
    assert check_count({"audience": [{"a": 1}, {"a": 1}]}) == [{"a": 1}]
    with pytest.raises(ValueError, match="audience: at most 1 queries"):
        check_count({"audience": [{"a": 1}, {"b": 1}]}, max_queries=1)


# -- the backplane refusing --------------------------------------------------------------------


async def test_a_backplane_that_cannot_take_the_change_gets_503_with_retry_after(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    with RedisServer() as redis_server:
        config = base_config(redis=redis_server.url, backplane={"connect_retries": 0})
        bow = await start_bow(standard_bow(config))
        url = f"http://127.0.0.1:{bow.port}"
        redis_server.stop()
        for path, body in [
            (CRITERIA, {"id": "u1", "criteria": {}}),
            (DISCONNECT, {"ids": ["u1"]}),
        ]:
            status, text, headers = await post(http, url + path, body)
            assert status == 503, text
            assert int(headers["Retry-After"]) >= 1
            assert str(redis_server.port) not in text


# -- embedded -------------------------------------------------------------------------------------


async def test_bow_has_the_same_operations_as_coroutines(start_bow: StartBow) -> None:
    backplane = Recording([count_answer((1, {"u1"}), 10)])
    bow = standard_bow(base_config(), backplane)
    with pytest.raises(RuntimeError, match="not started"):
        await bow.count([])
    await start_bow(bow)
    assert isinstance(await bow.set_criteria({"id": "u1", "criteria": {"a": 1}}), str)
    await bow.disconnect(["u1"], "bye")
    assert await bow.count([{"a": 1}]) == {"sockets": 1, "listeners": 1, "complete": True}
    assert backplane.published[:2] == [
        SetCriteriaEvent([("u1", {"a": 1, "__id": "u1"})]),
        KickEvent(["u1"], "bye", "new_token"),
    ]
    with pytest.raises(ValueError, match="reconnect"):
        await bow.disconnect(["u1"], reconnect="soon")
    with pytest.raises(ValueError, match=r"1\.criteria"):
        await bow.set_criteria([{"id": "u1", "criteria": {}}, {"id": "u2", "criteria": []}])
    with pytest.raises(ValueError, match=r"audience\.0"):
        await bow.count([{}])
    assert len(backplane.published) == 3


# -- inbound paths under the prefix ----------------------------------------------------------


@pytest.mark.parametrize("path", ["/_bow", "/_bow/criteria", "/_bow/v1/messages"])
def test_an_inbound_path_under_the_prefix_is_a_value_error(path: str) -> None:
    with pytest.raises(ValueError, match=r"api\.prefix"):
        standard_bow().inbound(
            path=path,
            create_message_from_request_body=lambda body: body,
            middleware_version="v1.1",
        )


def test_a_path_that_only_starts_like_the_prefix_is_fine() -> None:
    standard_bow().inbound(
        path="/_bowling", create_message_from_request_body=lambda b: b, middleware_version="v1.1"
    )


async def test_the_prefix_is_checked_against_the_inbounds_at_start(
    start_bow: StartBow,
) -> None:
    bow = standard_bow()
    bow.config = Bow(base_config(api={"prefix": PATH.rsplit("/", 1)[0]})).config
    with pytest.raises(ValueError, match=r"under api\.prefix"):
        await start_bow(bow)
