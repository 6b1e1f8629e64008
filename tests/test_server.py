"""Contract section 1: configuration, registration, start and stop of ``Bow``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bow_gateway import Bow

from .support import base_config, standard_bow

StartBow = Callable[[Bow], Awaitable[Bow]]


def criteria(details: Any) -> dict[str, Any]:
    return {}


def message(body: Any) -> Any:
    return body


def listener(token: Any) -> dict[str, Any]:
    return {"id": token}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda c: c.pop("port"), "port"),
        (lambda c: c.update(port=70000), "port"),
        (lambda c: c.update(port="eighty"), "port"),
        (lambda c: c.pop("inbound"), "inbound"),
        (lambda c: c.pop("outbound"), "outbound"),
        (lambda c: c["inbound"].pop("realm"), "inbound.realm"),
        (lambda c: c["inbound"].update(username=""), "inbound.username"),
        (lambda c: c["inbound"].update(password=None), "inbound.password"),
        (lambda c: c["inbound"].update(max_body_size=0), "inbound.max_body_size"),
        (lambda c: c["outbound"].update(timeout=0), "outbound.timeout"),
        (lambda c: c["outbound"].update(timeout=-1), "outbound.timeout"),
        (lambda c: c["outbound"].pop("timeout"), "outbound.timeout"),
        (lambda c: c.update(redis=6379), "redis"),
        (lambda c: c.update(redis=[]), "redis"),
        (lambda c: c.update(https={"certfile": "cert.pem"}), "https"),
        (lambda c: c.update(prot=8080), "prot"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_invalid_configuration_raises_value_error_naming_the_field(
    change: Callable[[dict[str, Any]], Any], field: str
) -> None:
    config = base_config()
    config["inbound"] = dict(config["inbound"])
    config["outbound"] = dict(config["outbound"])
    change(config)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        Bow(config)


def test_configuration_defaults() -> None:
    bow = Bow(
        {
            "port": 8080,
            "inbound": {"realm": "r", "username": "u", "password": "p"},
            "outbound": {"timeout": 5},
        }
    )
    assert bow.config.host == "0.0.0.0"
    assert bow.config.max_body_size == 1_048_576
    assert bow.config.redis is None
    assert bow.config.log_interval is None


def test_registrations_chain_on_the_same_bow() -> None:
    bow = Bow(base_config())
    assert bow.middleware(version="1", create_criteria_from_listener_details=criteria) is bow
    assert (
        bow.inbound(path="/in", create_message_from_request_body=message, middleware_version="1")
        is bow
    )
    assert (
        bow.outbound(
            version="1", create_listener_details_from_token=listener, middleware_version="1"
        )
        is bow
    )
    assert bow.health_check(lambda request: None) is bow


def test_duplicate_middleware_version_is_refused_with_or_without_its_v() -> None:
    bow = Bow(base_config()).middleware(
        version="v1.1", create_criteria_from_listener_details=criteria
    )
    with pytest.raises(ValueError, match="already registered"):
        bow.middleware(version="1.1", create_criteria_from_listener_details=criteria)


def test_duplicate_outbound_version_is_refused() -> None:
    bow = Bow(base_config()).outbound(
        version="v2", create_listener_details_from_token=listener, middleware_version="1"
    )
    with pytest.raises(ValueError, match="already registered"):
        bow.outbound(
            version="v2", create_listener_details_from_token=listener, middleware_version="1"
        )


def test_duplicate_inbound_path_is_refused() -> None:
    bow = Bow(base_config()).inbound(
        path="/in", create_message_from_request_body=message, middleware_version="1"
    )
    with pytest.raises(ValueError, match="already registered"):
        bow.inbound(path="/in", create_message_from_request_body=message, middleware_version="1")


@pytest.mark.parametrize("path", ["/health", "/socket.io/x", "", "in", None])
def test_reserved_or_malformed_inbound_path_is_refused(path: Any) -> None:
    with pytest.raises(ValueError, match="path"):
        Bow(base_config()).inbound(
            path=path, create_message_from_request_body=message, middleware_version="1"
        )


@pytest.mark.parametrize("version", ["", "v", None, 1])
def test_empty_or_non_string_version_is_refused(version: Any) -> None:
    with pytest.raises(ValueError, match="middleware"):
        Bow(base_config()).middleware(
            version=version, create_criteria_from_listener_details=criteria
        )


def test_non_callable_functions_are_refused() -> None:
    bow = Bow(base_config())
    with pytest.raises(ValueError, match="create_criteria_from_listener_details"):
        bow.middleware(version="1", create_criteria_from_listener_details="criteria")
    with pytest.raises(ValueError, match="create_message_from_request_body"):
        bow.inbound(path="/in", create_message_from_request_body=None, middleware_version="1")
    with pytest.raises(ValueError, match="create_listener_details_from_token"):
        bow.outbound(version="1", create_listener_details_from_token=42, middleware_version="1")
    with pytest.raises(ValueError, match="health_check"):
        bow.health_check("ok")


async def test_inbound_naming_an_unregistered_middleware_fails_at_start() -> None:
    bow = Bow(base_config()).inbound(
        path="/in", create_message_from_request_body=message, middleware_version="v9"
    )
    with pytest.raises(ValueError, match=r"inbound '/in' names middleware version 'v9'"):
        await bow.start()


async def test_outbound_naming_an_unregistered_middleware_fails_at_start() -> None:
    bow = (
        Bow(base_config())
        .middleware(version="1", create_criteria_from_listener_details=criteria)
        .outbound(version="2", create_listener_details_from_token=listener, middleware_version="3")
    )
    with pytest.raises(ValueError, match="outbound '2' names middleware version '3'"):
        await bow.start()


async def test_start_binds_a_free_port_and_stop_returns(start_bow: StartBow) -> None:
    bow = standard_bow()
    await bow.start()
    assert isinstance(bow.port, int) and bow.port > 0
    await bow.stop()
    await bow.stop()  # stopping twice is harmless


async def test_port_already_in_use_fails_start_cleanly(start_bow: StartBow) -> None:
    first = await start_bow(standard_bow())
    second = standard_bow(base_config(port=first.port))
    with pytest.raises(OSError):
        await second.start()


async def test_log_interval_logs_the_number_of_listeners(
    start_bow: StartBow, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    caplog.set_level(logging.INFO, logger="bow_gateway")
    await start_bow(standard_bow(base_config(middleware={"log_interval": 0.05})))
    await asyncio.sleep(0.2)
    assert any("0 listeners connected" in record.getMessage() for record in caplog.records)


async def test_stop_closes_transports_so_that_clients_reconnect_elsewhere(
    start_bow: StartBow,
) -> None:
    """A rolling deploy: the client of a stopped instance comes back by itself to the next one."""
    import asyncio

    import socketio

    from .support import token

    first = standard_bow()
    await first.start()
    port = first.port
    client = socketio.AsyncClient(reconnection_delay=0.1, reconnection_delay_max=0.2)
    reconnected = asyncio.Event()
    connects = 0

    async def on_connect() -> None:
        nonlocal connects
        connects += 1
        if connects == 2:
            reconnected.set()

    client.on("connect", on_connect)
    await client.connect(f"http://127.0.0.1:{port}?v=1.3", transports=["websocket"])
    try:
        await client.call("authenticate", token("USER/1"), timeout=5)
        await first.stop()
        await start_bow(standard_bow(base_config(port=port)))  # the next instance
        await asyncio.wait_for(reconnected.wait(), 10)
        await asyncio.sleep(0.1)  # python-socketio marks itself connected after the handler
        await client.call("authenticate", token("USER/1"), timeout=5)  # served by the new one
    finally:
        await client.disconnect()


async def test_health_is_503_while_stopping(start_bow: StartBow) -> None:
    bow = await start_bow(standard_bow())
    bow._stopping = True  # what stop() sets first, so that load balancers look elsewhere
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{bow.port}/health") as response:
            assert response.status == 503
    bow._stopping = False


class _TableCriteria:
    """A middleware whose criteria live in a table that changes, and which says when it does."""

    def __init__(self, table: dict[str, dict[str, Any]]) -> None:
        self.table = table
        self.changes: Any = None

    def __call__(self, details: Any) -> dict[str, Any]:
        if details["id"] not in self.table:
            raise LookupError(f"no listener {details['id']!r}")
        return self.table[details["id"]]

    async def watch(self) -> Any:
        import asyncio

        self.changes = asyncio.Queue()
        while True:
            yield await self.changes.get()


async def test_middleware_that_watches_re_indexes_listeners_without_reconnecting(
    start_bow: StartBow,
) -> None:
    """A listener who gains access starts receiving at once, one who loses it stops."""
    import asyncio

    import aiohttp

    from .support import AUTH, Listener

    middleware = _TableCriteria({"alice": {"role": "reader"}, "bob": {"role": "admin"}})
    bow = await start_bow(
        Bow(base_config())
        .middleware(version="1", create_criteria_from_listener_details=middleware)
        .inbound(path="/in", create_message_from_request_body=message, middleware_version="1")
        .outbound(version="1", create_listener_details_from_token=listener, middleware_version="1")
    )
    url = f"http://127.0.0.1:{bow.port}"
    alice, bob = Listener(url), Listener(url)
    for name, client in (("alice", alice), ("bob", bob)):
        await client.connect("1")
        await client.authenticate(name)
    try:
        index = bow._outbound.indices["1"]  # type: ignore[union-attr]

        async def refreshed(listener_id: str, criteria: dict[str, Any]) -> None:
            for _ in range(100):
                if index.criteria_of(listener_id) == criteria:
                    return
                await asyncio.sleep(0.02)
            raise AssertionError(f"{listener_id} kept {index.criteria_of(listener_id)}")

        async def post(name: str) -> None:
            async with aiohttp.ClientSession() as http:
                body = {"name": name, "audience": [{"role": "admin"}]}
                async with http.post(url + "/in", json=body, headers=AUTH) as response:
                    assert response.status == 204

        middleware.table = {"alice": {"role": "admin"}}  # alice promoted, bob removed
        middleware.changes.put_nowait(None)  # None: every listener may have changed
        await refreshed("bob", {"__id": "bob"})
        await refreshed("alice", {"role": "admin", "__id": "alice"})
        await post("PING")
        assert (await alice.next_event())[0] == "PING"
        await bob.no_event()
        assert bob.client.connected and alice.client.connected
        middleware.table["bob"] = {"role": "admin"}
        middleware.changes.put_nowait(["bob"])  # only bob changed
        await refreshed("bob", {"role": "admin", "__id": "bob"})
        await post("PONG")
        assert (await bob.next_event())[0] == "PONG"
    finally:
        await alice.close()
        await bob.close()


class _SlowTableCriteria(_TableCriteria):
    """Reads its table at once, then answers only when ``release`` is set."""

    def __init__(self, table: dict[str, dict[str, Any]]) -> None:
        import asyncio

        super().__init__(table)
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, details: Any) -> dict[str, Any]:  # type: ignore[override]
        criteria = super().__call__(details)
        self.reading.set()
        await self.release.wait()
        return criteria


async def test_a_change_announced_while_a_listener_authenticates_is_not_lost(
    start_bow: StartBow,
) -> None:
    # Regression: the refresh skipped the listener (not indexed yet), and the criteria read
    # before the change were indexed afterwards: stale until the next change.
    import asyncio

    from .support import Listener

    middleware = _SlowTableCriteria({"carol": {"role": "reader"}})
    bow = await start_bow(
        Bow(base_config())
        .middleware(version="1", create_criteria_from_listener_details=middleware)
        .inbound(path="/in", create_message_from_request_body=message, middleware_version="1")
        .outbound(version="1", create_listener_details_from_token=listener, middleware_version="1")
    )
    carol = Listener(f"http://127.0.0.1:{bow.port}")
    await carol.connect("1")
    try:
        authenticated = asyncio.ensure_future(carol.authenticate("carol"))
        await asyncio.wait_for(middleware.reading.wait(), 5)  # read: reader
        middleware.table = {"carol": {"role": "admin"}}
        middleware.changes.put_nowait(["carol"])
        await asyncio.sleep(0.2)  # the refresh runs now, and finds carol not indexed yet
        middleware.release.set()
        await authenticated
        index = bow._outbound.indices["1"]  # type: ignore[union-attr]
        for _ in range(100):
            if index.criteria_of("carol") == {"role": "admin", "__id": "carol"}:
                break
            await asyncio.sleep(0.02)
        assert index.criteria_of("carol") == {"role": "admin", "__id": "carol"}
    finally:
        await carol.close()


async def test_stop_leaves_no_task_of_engineio_running(start_bow: StartBow) -> None:
    # Regression: engineio's ping-check task, started by the first connection, outlived stop()
    # and kept the stopped gateway in memory.
    import asyncio

    from .support import Listener, token

    bow = await start_bow(standard_bow(base_config()))
    listener = Listener(f"http://127.0.0.1:{bow.port}")
    await listener.connect()
    await listener.authenticate(token("USER/1"))
    await listener.close()
    await bow.stop()
    left = [task for task in asyncio.all_tasks() if "_service_task" in repr(task.get_coro())]
    assert not left
