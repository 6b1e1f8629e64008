"""Protocol 2's wire (and protocol 1's), as the official socket.io-client (Node) sees it.

The other protocol-2 tests use python-socketio, whose server and client may agree on things a
JavaScript client reads differently (a refused namespace's ``connect_error`` data, for one, reaches
the client only when python-socketio's server is created with ``namespaces="*"``). Here each test
runs ``tests/node/wire.mjs`` (socket.io-client 4.8, pinned by ``tests/node/package-lock.json``)
against a real gateway on a free port and checks the JSON lines it prints: every argument of every
event, of the acknowledgement and of ``alert``, and ``connect_error``'s ``message`` and ``data``.

The session installs socket.io-client with ``npm ci`` when ``tests/node/node_modules`` is missing
(npm's registry must be reachable then); Node itself is a Debian package that
``tests/install-system-packages.sh`` installs.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from bow_gateway.inbounds.passthrough import create_message_from_envelope
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound

from bow_gateway import Bow

from .support import AUTH, PATH, SECRET, WAIT, Client, Gateway, base_config, token

NODE_DIR = Path(__file__).resolve().parent / "node"
WIRE = NODE_DIR / "wire.mjs"
VERSION = "v1.3"
P2 = {"v": VERSION, "proto": "2"}
P1 = {"v": VERSION}
AUTHOR = {"role": "author", "blogId": 42}
BLOG_42 = [{"blogId": 42}]
BLOG_7 = [{"blogId": 7}]
ACK_KEYS = {"id", "position", "recovered", "reason", "criteria_changed", "expires_in"}
INFO_KEYS = {"code", "reason", "fatal", "reconnect"}
DEFAULT_TRANSPORTS = None  # socket.io-client's own: long-polling, then the websocket upgrade
TRANSPORTS = [DEFAULT_TRANSPORTS, ["websocket"], ["polling"]]


# -- Node and socket.io-client -------------------------------------------------------------


@pytest.fixture(scope="session")
def wire() -> list[str]:
    """The command that runs ``tests/node/wire.mjs``, with socket.io-client installed next to it
    (``npm ci`` once per session when ``tests/node/node_modules`` is missing). Fails, never
    skips, without Node."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail(
            "these tests need Node.js and npm (Debian's nodejs and npm): run "
            "`sh tests/install-system-packages.sh` as root (or `sudo apt-get install nodejs npm`)"
        )
    # Each pytest-xdist worker runs this session fixture: one `npm ci` at a time, and the others
    # find its node_modules (a lock on the folder itself, released when it is closed).
    lock = os.open(NODE_DIR, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (NODE_DIR / "node_modules" / "socket.io-client" / "package.json").exists():
            done = subprocess.run(
                [npm, "ci", "--prefix", str(NODE_DIR), "--no-audit", "--no-fund"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if done.returncode != 0:
                pytest.fail(
                    f"`npm ci --prefix tests/node` failed ({done.returncode}); npm's registry "
                    "must be reachable to install socket.io-client:\n"
                    f"{done.stdout}\n{done.stderr}"
                )
    finally:
        os.close(lock)
    return [node, str(WIRE)]


class Wire:
    """One ``node wire.mjs`` process: its observations, one JSON object a line, in order."""

    def __init__(self, process: asyncio.subprocess.Process, scenario: str) -> None:
        self.process = process
        self.scenario = scenario
        self.seen: list[dict[str, Any]] = []

    async def next(self, timeout: float = WAIT) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not line:
            raise AssertionError(
                f"wire.mjs {self.scenario} ended after {self.seen}{await self._err()}"
            )
        observation: dict[str, Any] = json.loads(line)
        self.seen.append(observation)
        return observation

    async def expect(self, kind: str, timeout: float = WAIT) -> dict[str, Any]:
        """The next observation must be of type ``kind``."""
        observation = await self.next(timeout)
        assert observation["type"] == kind, f"expected {kind}, got {observation}"
        return observation

    async def event(self, timeout: float = WAIT) -> tuple[str, list[Any]]:
        """The next observation must be an event (not ``__position``): its name and arguments."""
        while (observation := await self.expect("event", timeout))["name"] == "__position":
            pass  # a quiet socket may be told one
        return observation["name"], observation["args"]

    async def authenticated(self) -> list[Any]:
        """``connect``, then the acknowledgement: every argument it received."""
        await self.expect("connect")
        return list((await self.expect("ack"))["args"])

    async def ended(self) -> None:
        """The process exits by itself, having printed nothing more."""
        assert self.process.stdout is not None
        rest = await asyncio.wait_for(self.process.stdout.read(), WAIT)
        assert rest == b"", rest
        assert await asyncio.wait_for(self.process.wait(), WAIT) == 0, await self._err()

    async def close(self) -> None:
        """Close stdin (the client closes its socket and exits); kill it if it does not."""
        if self.process.returncode is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                await asyncio.wait_for(self.process.wait(), WAIT)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()

    async def _err(self) -> str:
        """What it wrote on stderr, once it has exited (within WAIT)."""
        assert self.process.stderr is not None
        try:
            await asyncio.wait_for(self.process.wait(), WAIT)
        except TimeoutError:
            return " (still running)"
        return f" (exit {self.process.returncode})\n" + (await self.process.stderr.read()).decode(
            errors="replace"
        )


Run = Callable[..., Awaitable[Wire]]


@pytest.fixture
async def node(wire: list[str]) -> AsyncIterator[Run]:
    """``client = await node(url, "listen", query=P2, token=..., options={...})``: a running
    wire.mjs (closed at the end of the test)."""
    started: list[Wire] = []

    async def run(url: str, scenario: str, **options: Any) -> Wire:
        process = await asyncio.create_subprocess_exec(
            *wire,
            url,
            scenario,
            json.dumps(options),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        started.append(Wire(process, scenario))
        return started[-1]

    yield run
    await asyncio.gather(*(client.close() for client in started))


# -- the gateway ---------------------------------------------------------------------------


def envelope_bow(**config: Any) -> Bow:
    """The JWT outbound v1.3, criteria from the token's claim, messages as envelopes
    ``{"name", "payload"?, "audience"}`` (so that a message may have no payload)."""
    return (
        Bow(base_config(**config))
        .middleware(version="v1.1", create_criteria_from_listener_details=criteria_from_claim())
        .inbound(
            path=PATH,
            create_message_from_request_body=create_message_from_envelope,
            middleware_version="v1.1",
        )
        .outbound(
            version=VERSION,
            create_listener_details_from_token=JwtOutbound(secret=SECRET),
            middleware_version="v1.1",
        )
    )


Serve = Callable[[Bow], Awaitable[Gateway]]


class Pushed(NamedTuple):
    """A message the inbound accepted: its ``Bow-Position`` and ``Bow-Message-Id``."""

    position: str
    id: str

    def meta(self, **more: Any) -> dict[str, Any]:
        """The protocol-2 ``meta`` its event carries (sections 6 and 16)."""
        return {"position": self.position, "id": self.id, **more}


async def push(gateway: Gateway, body: Any) -> Pushed:
    """POST a message to the inbound: its ``Bow-Position`` and ``Bow-Message-Id``."""
    async with gateway.http.post(gateway.url + PATH, json=body, headers=AUTH) as response:
        assert response.status == 204, f"push refused: {response.status} {await response.text()}"
        return Pushed(response.headers["Bow-Position"], response.headers["Bow-Message-Id"])


async def settled(gateway: Gateway, watcher: Client) -> None:
    """Push a message to ``watcher`` alone and wait for it: everything pushed before it has
    been delivered, and is in the recovery window."""
    await gateway.sentinel([{"__id": "WATCHER"}], watcher)


async def refused(node: Run, serve: Serve, **options: Any) -> dict[str, Any]:
    """Connect with ``options``, expect ``connect_error``: its ``{"message", "data"}``."""
    gateway = await serve(envelope_bow())
    client = await node(gateway.url, "refused", **options)
    error = await client.expect("connect_error")
    await client.ended()
    assert isinstance(error["message"], str) and error["message"], error
    return error


async def listening(
    node: Run, gateway: Gateway, listener_token: Any, **options: Any
) -> tuple[Wire, list[Any]]:
    """A wire.mjs ``listen``: the client, once authenticated, and its ack's arguments."""
    client = await node(gateway.url, "listen", token=listener_token, **options)
    return client, await client.authenticated()


# -- connect_error -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query", [{"v": "v9", "proto": "2"}, {"v": "v9"}, {"proto": "2"}], ids=["p2", "p1", "no-v"]
)
async def test_an_unknown_version_gets_connect_error_4020(
    node: Run, serve: Serve, query: dict[str, str]
) -> None:
    error = await refused(node, serve, query=query)
    assert "outbound version" in error["message"], error
    assert error["data"] == {"code": 4020, "reason": "unknown_version", "reconnect": "never"}


@pytest.mark.parametrize("query", [P2, P1], ids=["p2", "p1"])
async def test_another_namespace_gets_connect_error_4021(
    node: Run, serve: Serve, query: dict[str, str]
) -> None:
    error = await refused(node, serve, query=query, namespace="/other")
    assert "'/other'" in error["message"], error
    assert error["data"] == {"code": 4021, "reason": "bad_namespace", "reconnect": "never"}


async def test_proto_3_gets_connect_error_4022(node: Run, serve: Serve) -> None:
    error = await refused(node, serve, query={"v": VERSION, "proto": "3"})
    assert "'3'" in error["message"], error
    assert error["data"] == {"code": 4022, "reason": "bad_protocol", "reconnect": "never"}


# -- protocol 2 ----------------------------------------------------------------------------


@pytest.mark.parametrize("transports", TRANSPORTS, ids=["default", "websocket", "polling"])
async def test_a_protocol_2_event_is_payload_and_meta_with_the_204s_bow_position(
    node: Run, serve: Serve, transports: list[str] | None
) -> None:
    gateway = await serve(envelope_bow())
    client, _ = await listening(
        node, gateway, token("USER/1", AUTHOR), query=P2, options={}, transports=transports
    )
    payload = {"title": "é", "list": [1, None, True], "n": 1.5}
    position = await push(gateway, {"name": "NEW_ARTICLE", "payload": payload, "audience": BLOG_42})
    assert await client.event() == ("NEW_ARTICLE", [payload, position.meta()])


async def test_a_protocol_2_message_without_payload_is_null_and_meta(
    node: Run, serve: Serve
) -> None:
    gateway = await serve(envelope_bow())
    client, _ = await listening(node, gateway, token("USER/1", AUTHOR), query=P2, options={})
    position = await push(gateway, {"name": "bare", "audience": BLOG_42})
    assert await client.event() == ("bare", [None, position.meta()])


async def test_the_ack_is_one_result_object_with_exactly_the_six_keys(
    node: Run, serve: Serve
) -> None:
    gateway = await serve(envelope_bow())
    watcher = await gateway.jwt_listener("WATCHER")
    before = await push(gateway, {"name": "before", "audience": BLOG_7})
    await settled(gateway, watcher)  # a position after it, to the watcher alone
    _, ack = await listening(node, gateway, token("USER/1", AUTHOR), query=P2, options={})
    [result] = ack
    assert set(result) == ACK_KEYS, result
    assert result["id"] == "USER/1"
    assert isinstance(result["position"], str) and result["position"] not in ("", before.position)
    assert (result["recovered"], result["reason"], result["criteria_changed"]) == (None, None, None)
    assert isinstance(result["expires_in"], int | float) and 3500 < result["expires_in"] <= 3600


async def test_the_acks_position_is_a_string_before_any_message_and_recovers_what_follows(
    node: Run, serve: Serve
) -> None:
    gateway = await serve(envelope_bow())
    first, ack = await listening(node, gateway, token("USER/1", AUTHOR), query=P2, options={})
    [result] = ack
    await first.close()
    missed = await push(gateway, {"name": "missed", "audience": BLOG_42})
    assert isinstance(result["position"], str) and result["position"], result
    again, ack = await listening(
        node, gateway, token("USER/1", AUTHOR), query=P2, options={"since": result["position"]}
    )
    assert ack[0]["recovered"] is True, ack
    assert await again.event() == ("missed", [None, missed.meta(replayed=True)])


async def test_authenticate_without_options_also_gets_the_result_object(
    node: Run, serve: Serve
) -> None:
    gateway = await serve(envelope_bow())
    _, ack = await listening(node, gateway, token("USER/1", AUTHOR), query=P2)  # (token, ack)
    [result] = ack
    assert set(result) == ACK_KEYS and result["id"] == "USER/1", result


async def test_recovery_with_since_replays_with_replayed_true_then_live(
    node: Run, serve: Serve
) -> None:
    gateway = await serve(envelope_bow())
    watcher = await gateway.jwt_listener("WATCHER")
    first, _ = await listening(node, gateway, token("USER/1", AUTHOR), query=P2, options={})
    since = await push(gateway, {"name": "seen", "audience": BLOG_42})
    assert await first.event() == ("seen", [None, since.meta()])
    await first.close()
    missed = [
        await push(gateway, {"name": name, "payload": {"i": i}, "audience": audience})
        for i, (name, audience) in enumerate([("a", BLOG_42), ("x", BLOG_7), ("b", BLOG_42)])
    ]
    await settled(gateway, watcher)
    again, ack = await listening(
        node, gateway, token("USER/1", AUTHOR), query=P2, options={"since": since.position}
    )
    [result] = ack
    assert (result["recovered"], result["reason"], result["criteria_changed"]) == (
        True,
        None,
        False,
    ), result
    assert await again.event() == ("a", [{"i": 0}, missed[0].meta(replayed=True)])
    assert await again.event() == ("b", [{"i": 2}, missed[2].meta(replayed=True)])
    live = await push(gateway, {"name": "live", "payload": 1, "audience": BLOG_42})
    assert await again.event() == ("live", [1, live.meta()])


async def test_a_refused_token_gets_alert_text_and_info_4002_then_a_disconnect(
    node: Run, serve: Serve
) -> None:
    gateway = await serve(envelope_bow())
    client = await node(gateway.url, "listen", query=P2, token="not-a-jwt", options={})
    await client.expect("connect")
    alert = await client.expect("alert")
    text, info = alert["args"]
    assert isinstance(text, str) and text, alert
    assert set(info) == INFO_KEYS, info
    assert info == {"code": 4002, "reason": "auth_refused", "fatal": True, "reconnect": "new_token"}
    assert (await client.expect("disconnect"))["reason"] == "io server disconnect"
    await client.ended()


async def test_a_quiet_protocol_2_socket_gets_position_null_and_meta(
    node: Run, serve: Serve
) -> None:
    gateway = await serve(envelope_bow(recovery={"position_interval": 0.3}))
    client, _ = await listening(node, gateway, token("USER/1", AUTHOR), query=P2, options={})
    elsewhere = await push(gateway, {"name": "elsewhere", "audience": BLOG_7})
    while True:  # an older position may come first
        observation = await client.expect("event", timeout=3)
        assert observation["name"] == "__position", observation
        payload, meta = observation["args"]
        assert payload is None and set(meta) == {"position"}, observation
        if meta["position"] == elsewhere.position:
            break


# -- protocol 1, unchanged -----------------------------------------------------------------


async def test_a_protocol_1_event_has_one_argument_the_payload(node: Run, serve: Serve) -> None:
    gateway = await serve(envelope_bow())
    client, _ = await listening(node, gateway, token("USER/1", AUTHOR), query=P1)
    await push(gateway, {"name": "NEW_ARTICLE", "payload": {"title": "é"}, "audience": BLOG_42})
    await push(gateway, {"name": "bare", "audience": BLOG_42})
    assert await client.event() == ("NEW_ARTICLE", [{"title": "é"}])
    assert await client.event() == ("bare", [])


async def test_a_protocol_1_ack_has_no_arguments(node: Run, serve: Serve) -> None:
    gateway = await serve(envelope_bow())
    _, ack = await listening(node, gateway, token("USER/1", AUTHOR), query=P1)
    assert ack == []


async def test_a_protocol_1_alert_is_one_text_starting_with_the_reason(
    node: Run, serve: Serve
) -> None:
    gateway = await serve(envelope_bow())
    client = await node(gateway.url, "listen", query=P1, token="not-a-jwt")
    await client.expect("connect")
    [text] = (await client.expect("alert"))["args"]
    assert isinstance(text, str) and text.startswith("auth_refused: "), text
    assert (await client.expect("disconnect"))["reason"] == "io server disconnect"
    await client.ended()


async def test_a_protocol_1_socket_gets_no_position_event(node: Run, serve: Serve) -> None:
    gateway = await serve(envelope_bow(recovery={"position_interval": 0.2}))
    watcher = await gateway.jwt_listener("WATCHER")
    client, _ = await listening(node, gateway, token("USER/1", AUTHOR), query=P1)
    await asyncio.sleep(0.6)
    await settled(gateway, watcher)
    await push(gateway, {"name": "after", "payload": 1, "audience": BLOG_42})
    assert await client.next() == {"type": "event", "name": "after", "args": [1]}
