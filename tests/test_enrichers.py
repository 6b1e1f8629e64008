"""Contract section 15: enrichers (ToyMB's enrichment API), against a real gateway on a free port
(the memory backplane), over real HTTP, to real python-socketio listeners."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bow_gateway import Bow
from bow_gateway.app.standalone import build_bow, load_settings
from bow_gateway.core.enrichers import EnricherInitError, Enrichers
from bow_gateway.core.message import validate_message

from .support import (
    AUTH,
    PASSWORD,
    PATH,
    REALM,
    SECRET,
    USER,
    Gateway,
    as_kind,
    base_config,
    standard_bow,
)

Serve = Callable[[Bow], Awaitable[Gateway]]
BATCHES = "/v1.2/batches"  # an inbound whose body is the message, or the list of messages
ADMINS = [{"role": "admin"}]
OPS = [{"role": "ops"}]


def order(number: int) -> dict[str, Any]:
    return {"name": "orders/created", "audience": ADMINS, "number": number}


async def post(gateway: Gateway, body: Any, path: str = PATH) -> tuple[int, str, dict[str, str]]:
    async with gateway.http.post(gateway.url + path, json=body, headers=AUTH) as response:
        return response.status, await response.text(), dict(response.headers)


def add_customer(message: dict[str, Any]) -> dict[str, Any]:
    message["payload"]["customer"] = "ACME"
    return message


def refuse(message: dict[str, Any]) -> dict[str, Any]:
    raise LookupError("no such customer")


# -- what enrichers do ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "coroutine"])
async def test_an_enricher_changes_the_payload_and_the_audience(serve: Serve, kind: str) -> None:
    def to_ops(message: dict[str, Any]) -> dict[str, Any]:
        return {**message, "payload": {**message["payload"], "seen": True}, "audience": OPS}

    gateway = await serve(standard_bow().enricher(filter="orders/#", enrich=as_kind(kind, to_ops)))
    admin = await gateway.jwt_listener("ADMIN", {"role": "admin"})
    ops = await gateway.jwt_listener("OPS", {"role": "ops"})
    await gateway.push(order(1))
    assert await ops.expect("orders/created") == {**order(1), "seen": True}
    await gateway.sentinel(ADMINS, admin)  # the admin's next event: it never got the order


async def test_enrichers_run_in_registration_order(serve: Serve) -> None:
    def stamp(mark: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def enrich(message: dict[str, Any]) -> dict[str, Any]:
            message["payload"]["trail"] = [*message["payload"].get("trail", []), mark]
            return message

        return enrich

    bow = standard_bow().enricher(filter="orders/#", enrich=stamp("first"))
    bow.enricher(filter="orders/+", enrich=stamp("second"))
    gateway = await serve(bow)
    admin = await gateway.jwt_listener("ADMIN", {"role": "admin"})
    await gateway.push(order(1))
    assert (await admin.expect("orders/created"))["trail"] == ["first", "second"]


async def test_a_message_whose_name_does_not_match_skips_the_enricher(serve: Serve) -> None:
    seen: list[str] = []

    def record(message: dict[str, Any]) -> dict[str, Any]:
        seen.append(message["name"])
        return add_customer(message)

    gateway = await serve(standard_bow().enricher(filter="orders/#", enrich=record))
    admin = await gateway.jwt_listener("ADMIN", {"role": "admin"})
    other = {"name": "ordersX/created", "audience": ADMINS}
    await gateway.push(other)
    assert await admin.expect("ordersX/created") == other
    await gateway.push({"name": "orders", "audience": ADMINS})  # '#' takes the parent level too
    assert (await admin.expect("orders"))["customer"] == "ACME"
    assert seen == ["orders"]


async def test_the_enricher_receives_name_payload_and_audience_and_nothing_else(
    serve: Serve,
) -> None:
    received: list[dict[str, Any]] = []

    def record(message: dict[str, Any]) -> dict[str, Any]:
        received.append(dict(message))
        return message

    gateway = await serve(standard_bow().enricher(filter="#", enrich=record))
    admin = await gateway.jwt_listener("ADMIN", {"role": "admin"})
    await gateway.push(order(1))
    await admin.expect("orders/created")
    assert received == [{"name": "orders/created", "payload": order(1), "audience": ADMINS}]


# -- refusals -------------------------------------------------------------------------------------


async def test_an_enricher_that_raises_refuses_the_message_422_naming_it(serve: Serve) -> None:
    gateway = await serve(standard_bow().enricher(filter="orders/#", enrich=refuse))
    admin = await gateway.jwt_listener("ADMIN", {"role": "admin"})
    status, text, headers = await post(gateway, order(1))
    assert status == 422
    assert text == (
        "422: the enricher tests.test_enrichers:refuse refused the message: no such customer"
    )
    assert "Bow-Position" not in headers
    await gateway.sentinel(ADMINS, admin)


async def test_an_enricher_that_returns_an_invalid_message_refuses_it(serve: Serve) -> None:
    def nameless(message: dict[str, Any]) -> dict[str, Any]:
        return {**message, "name": ""}

    gateway = await serve(standard_bow().enricher(filter="#", enrich=nameless))
    status, text, _ = await post(gateway, order(1))
    assert status == 422
    assert text.endswith(
        ".nameless refused the message: it returned an invalid message: name: must not be empty"
    ), text


async def test_an_enricher_that_returns_none_refuses_the_message(serve: Serve) -> None:
    def forgetful(message: dict[str, Any]) -> None:
        message["payload"]["customer"] = "ACME"  # changed in place, and not returned

    gateway = await serve(standard_bow().enricher(filter="#", enrich=forgetful))
    status, text, _ = await post(gateway, order(1))
    assert status == 422
    assert ".forgetful refused the message: it returned None, not the message" in text, text


async def test_an_enricher_refusing_one_message_of_a_batch_refuses_the_batch(
    serve: Serve,
) -> None:
    def picky(message: dict[str, Any]) -> dict[str, Any]:
        if message["payload"] == 2:
            raise ValueError("not number 2")
        return message

    bow = standard_bow().inbound(
        path=BATCHES, create_message_from_request_body=lambda body: body, middleware_version="v1.1"
    )
    gateway = await serve(bow.enricher(filter="orders/#", enrich=picky))
    admin = await gateway.jwt_listener("ADMIN", {"role": "admin"})
    batch = [{"name": "orders/created", "payload": n, "audience": ADMINS} for n in (1, 2, 3)]
    status, text, _ = await post(gateway, batch, BATCHES)
    assert status == 422
    assert text.startswith("422: 1: the enricher tests.test_enrichers:"), text
    assert text.endswith(".picky refused the message: not number 2"), text
    await gateway.sentinel(ADMINS, admin)


async def test_a_hanging_enricher_is_cut_off_after_inbound_timeout_with_503(
    serve: Serve,
) -> None:
    async def hang(message: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(60)
        return message

    timeout = 0.5
    inbound = {"realm": REALM, "username": USER, "password": PASSWORD, "timeout": timeout}
    bow = standard_bow(base_config(inbound=inbound)).enricher(filter="orders/#", enrich=hang)
    gateway = await serve(bow)
    admin = await gateway.jwt_listener("ADMIN", {"role": "admin"})
    started = time.monotonic()
    status, _, headers = await post(gateway, order(1))
    elapsed = time.monotonic() - started
    assert status == 503
    assert int(headers["Retry-After"]) >= 1
    assert timeout <= elapsed < timeout + 0.5
    await gateway.sentinel(ADMINS, admin)


# -- init -----------------------------------------------------------------------------------------


async def test_init_runs_once_at_start_even_with_two_inbounds(serve: Serve) -> None:
    calls: list[str] = []

    async def setup() -> None:
        await asyncio.sleep(0)
        calls.append("init")

    def enrich(message: dict[str, Any]) -> dict[str, Any]:
        assert calls == ["init"]  # init ran before any message
        return add_customer(message)

    bow = standard_bow().inbound(
        path=BATCHES, create_message_from_request_body=lambda body: body, middleware_version="v1.1"
    )
    bow.enricher(filter="orders/#", enrich=enrich, init=setup)
    bow.enricher(filter="orders/+", enrich=lambda message: message, init=setup)  # the same init
    assert calls == []
    gateway = await serve(bow)
    assert calls == ["init"]
    admin = await gateway.jwt_listener("ADMIN", {"role": "admin"})
    await gateway.push(order(1))
    status, _, _ = await post(
        gateway, {"name": "orders/paid", "payload": {}, "audience": ADMINS}, BATCHES
    )
    assert status == 204
    assert (await admin.expect("orders/created"))["customer"] == "ACME"
    assert await admin.expect("orders/paid") == {"customer": "ACME"}
    assert calls == ["init"]


async def test_an_init_that_raises_stops_start() -> None:
    def broken() -> None:
        raise ConnectionRefusedError("no database")

    bow = standard_bow().enricher(filter="#", enrich=add_customer, init=broken)
    with pytest.raises(EnricherInitError, match="no database") as refused:
        await bow.start()
    assert "tests.test_enrichers:" in str(refused.value)
    assert isinstance(refused.value.__cause__, ConnectionRefusedError)
    assert bow.port is None


async def test_an_enricher_holding_resources_is_closed_by_stop(
    start_bow: Callable[[Bow], Awaitable[Bow]],
) -> None:
    class Pooled:
        closed = False

        def __call__(self, message: dict[str, Any]) -> dict[str, Any]:
            return message

        async def aclose(self) -> None:
            self.closed = True

    enrich = Pooled()
    bow = await start_bow(standard_bow().enricher(filter="#", enrich=enrich))
    await bow.stop()
    assert enrich.closed


# -- registration ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "a/#/b", "a+", "a/b#", "#/a", "+a/b", 7, None])
def test_a_malformed_filter_is_a_value_error_at_registration(bad: Any) -> None:
    with pytest.raises(ValueError, match="filter"):
        standard_bow().enricher(filter=bad, enrich=add_customer)


def test_an_enrich_or_init_that_is_not_callable_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="enrich must be callable"):
        standard_bow().enricher(filter="#", enrich="module:function")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="init must be callable"):
        standard_bow().enricher(filter="#", enrich=add_customer, init=42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("topic_filter", "name", "expected"),
    [
        ("orders/#", "orders/created", True),
        ("orders/#", "orders/eu/created", True),
        ("orders/#", "orders", True),
        ("orders/#", "ordersX", False),
        ("orders/+", "orders/created", True),
        ("orders/+", "orders/eu/created", False),
        ("orders/+", "orders", False),
        ("+/created", "orders/created", True),
        ("+/+", "/created", True),
        ("orders/created", "orders/created", True),
        ("orders/created", "orders/Created", False),
        ("#", "anything/at/all", True),
        ("#", "$remote/s1/rx/errors", False),
        ("+/s1/rx/errors", "$remote/s1/rx/errors", False),
        ("$remote/#", "$remote/s1/rx/errors", True),
        ("/a", "/a", True),
        ("/a", "a", False),
    ],
)
async def test_filters_match_names_as_mqtt_3_1_1_says(
    topic_filter: str, name: str, expected: bool
) -> None:
    # Through enrich(message), the one function every source of messages calls.
    enrichers = Enrichers(timeout=1)
    enrichers.add(topic_filter, add_customer)
    message = validate_message({"name": name, "payload": {}, "audience": ADMINS})
    enriched = await enrichers.enrich(message)
    assert (enriched.payload == {"customer": "ACME"}) is expected


# -- standalone mode ------------------------------------------------------------------------------

PASSTHROUGH = "bow_gateway.inbounds.passthrough:create_message_from_request_body"
PLUGINS = """
CALLS = []


def connect():
    CALLS.append("connect")


def tagger(tag):
    def enrich(message):
        message["payload"].setdefault("tags", []).append(tag)
        return message

    return enrich
"""


def config_file(folder: Path, enrichers: str) -> str:
    """A standalone file: the quick-start gateway's plugins, then ``enrichers``; its path."""
    path = folder / "gateway.toml"
    path.write_text(
        f"""
port = 0
host = "127.0.0.1"
[inbound]
realm = "{REALM}"
username = "{USER}"
password = "{PASSWORD}"
[outbound]
timeout = 5

[[middlewares]]
version = "v1.1"
create_criteria_from_listener_details = "bow_gateway.middlewares.claims:criteria_from_claim"
options = {{ claim = "criteria" }}

[[inbounds]]
path = "{PATH}"
create_message_from_request_body = "{PASSTHROUGH}"
middleware_version = "v1.1"

[[outbounds]]
version = "v1.3"
create_listener_details_from_token = "bow_gateway.outbounds.jwt:JwtOutbound"
options = {{ secret = "{SECRET}" }}
middleware_version = "v1.1"
{enrichers}
"""
    )
    return str(path)


async def test_enrichers_tables_of_a_toml_file_register_enrichers_in_order(
    tmp_path: Path, serve: Serve
) -> None:
    module = f"shop_{uuid.uuid4().hex}"  # beside the file
    (tmp_path / f"{module}.py").write_text(PLUGINS)
    path = config_file(
        tmp_path,
        f"""
[[enrichers]]
filter = "orders/#"
enrich = "{module}:tagger"
options = {{ tag = "first" }}
init = "{module}:connect"

[[enrichers]]
filter = "orders/+"
enrich = "{module}:tagger"
options = {{ tag = "second" }}
""",
    )
    try:
        settings = load_settings(path, environ={})
        assert [e.table for e in settings.enrichers] == ["[[enrichers]] #1", "[[enrichers]] #2"]
        gateway = await serve(build_bow(settings))
        assert sys.modules[module].CALLS == ["connect"]
        admin = await gateway.jwt_listener("ADMIN", {"role": "admin"})
        await gateway.push(order(1))
        assert (await admin.expect("orders/created"))["tags"] == ["first", "second"]
    finally:
        sys.modules.pop(module, None)


def test_a_malformed_filter_in_a_toml_file_names_its_table(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        """
[[enrichers]]
filter = "orders/#/paid"
enrich = "tests.test_enrichers:add_customer"
""",
    )
    with pytest.raises(ValueError, match=r"\[\[enrichers\]\] #1: filter: 'orders/#/paid': #"):
        build_bow(load_settings(path, environ={}))


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ('enrich = "tests.test_enrichers:add_customer"', "filter is missing"),
        ('filter = "#"', "enrich is missing"),
        ('filter = "#"\nenrich = "tests.test_enrichers:add_customer"\nwhen = 1', "unknown key"),
        ('filter = "#"\nenrich = "tests.test_enrichers:add_customer"\ninit = 1', "init must be"),
    ],
    ids=["no-filter", "no-enrich", "unknown-key", "bad-init"],
)
def test_a_bad_enrichers_table_is_refused_naming_it(tmp_path: Path, table: str, error: str) -> None:
    path = config_file(tmp_path, f"[[enrichers]]\n{table}\n")
    with pytest.raises(ValueError, match=rf"\[\[enrichers\]\] #1: {error}"):
        load_settings(path, environ={})
