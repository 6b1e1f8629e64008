"""``bow-gateway listen`` as a real process against a real ``serve``: whatever ends the session (a
``__disconnect`` message, a refused token or version, Ctrl-C, the gateway stopping), it closes its
HTTP session (no ``Unclosed client session``) and says why in words, never as a Python dict.

``--proto 2`` (docs/protocol-2.md): its arguments, and what it sends and prints against a scripted
python-socketio server that speaks protocol 2 as the spec says, sending exactly what each test needs
(an ack before or after a replay, a gap, a 4100 alert), which the real gateway cannot be made to on
demand."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import pytest
import socketio
from aiohttp import web

from bow_gateway.cli import main
from bow_gateway.cli.listening import RecentIds

from .support import SECRET, token
from .support.cli_listen import (
    BASIC,
    Listening,
    assert_closed_cleanly,
    listen,
    next_line,
    push_at,
    pushed,
)
from .support.served import Served, free_port, serve


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(tmp_path_factory.mktemp("serve"), BOW_JWT_SECRET=SECRET) as served:
        yield served


def push(served: Served, name: str, audience: list[dict[str, object]]) -> None:
    request = urllib.request.Request(
        served.url + "/v1/messages",
        data=json.dumps({"name": name, "audience": audience}).encode(),
        headers={"Content-Type": "application/json", "Authorization": BASIC},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 204


async def test_a_disconnect_message_ends_it_cleanly(gateway: Served) -> None:
    listening = await Listening.start("--url", gateway.url, "--id", "USER/41")
    await listening.until("listening on")
    push(gateway, "__disconnect", [{"__id": "USER/41"}])
    ended = await listening.end()
    assert ended.code == 1
    assert "bow-gateway listen: disconnected by the server" in ended.err
    assert_closed_cleanly(ended)


async def test_the_disconnect_is_said_with_its_code_and_reason(gateway: Served) -> None:
    # Regression: "disconnected by the server", without the code that Flywheel and SSE say.
    listening = await Listening.start("--url", gateway.url, "--id", "USER/45", "--proto", "2")
    await listening.until(f"listening on {gateway.url}/?v=v1&proto=2; ")  # a URL, with its "/"
    push(gateway, "__disconnect", [{"__id": "USER/45"}])
    ended = await listening.end()
    assert ended.code == 1
    assert (
        "bow-gateway listen: disconnected by the server: a __disconnect message "
        "(code 4006 disconnect_message)\n"
    ) in ended.err, ended.err
    assert_closed_cleanly(ended)


async def test_a_refused_token_ends_it_cleanly(gateway: Served) -> None:
    ended = await listen("--url", gateway.url, "--token", "not-a-token")
    assert ended.code == 1
    assert (
        "bow-gateway listen: authentication refused: auth_refused: the token was refused"
        in ended.err
    )
    assert_closed_cleanly(ended)


async def test_an_unknown_version_is_said_in_words(gateway: Served) -> None:
    ended = await listen("--url", gateway.url, "--version", "v2", "--id", "USER/42")
    assert ended.code == 1
    assert ended.err.strip().splitlines()[-1] == (
        f"bow-gateway listen: {gateway.url}/?v=v2 refused the connection: "
        "unknown outbound version 'v2': this gateway serves v1"
    )
    assert "{" not in ended.err, ended.err
    assert_closed_cleanly(ended)


async def test_ctrl_c_ends_it_cleanly(gateway: Served) -> None:
    listening = await Listening.start("--url", gateway.url, "--id", "USER/43")
    await listening.until("listening on")
    listening.process.send_signal(signal.SIGINT)
    ended = await listening.end()
    assert ended.code == 0
    assert_closed_cleanly(ended)


async def test_the_gateway_stopping_ends_it_cleanly(tmp_path: Path) -> None:
    with serve(tmp_path, BOW_JWT_SECRET=SECRET) as served:
        listening = await Listening.start("--url", served.url, "--id", "USER/44")
        await listening.until("listening on")
        assert await asyncio.to_thread(served.stop) == 0
        ended = await listening.end()
    assert ended.code == 1
    assert "disconnected by the server" in ended.err
    assert_closed_cleanly(ended)


# -- --proto 2: the arguments (in this process: no network) -------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--id", "a", "--since", "p.1"], "--since needs --proto 2"),
        (["--id", "a", "--proto", "1", "--since", "p.1"], "--since needs --proto 2"),
        (["--anonymous"], "--anonymous needs --proto 2"),
        (["--proto", "2", "--anonymous", "--id", "a"], "--anonymous authenticates without a token"),
        (["--proto", "2", "--anonymous", "--token", "t"], "--anonymous authenticates without"),
        (["--token", "t", "--ttl", "60"], "--ttl needs --id"),
        (["--id", "a", "--ttl", "0.5"], "--ttl must be a positive number of seconds"),
        (["--proto", "2"], "give --token TOKEN, or --id ID"),
    ],
)
def test_bad_protocol_2_arguments_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["listen", *args]) == 2
    assert message in capsys.readouterr().err


def test_proto_takes_1_or_2_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["listen", "--id", "a", "--proto", "3"]) == 2
    assert "invalid choice: '3'" in capsys.readouterr().err


def test_the_help_describes_protocol_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["listen", "--help"]) == 0
    out = capsys.readouterr().out
    for said in ("--proto", "--since POSITION", "--anonymous", "--ttl", "4100", "position"):
        assert said in out


# -- --proto 2 against a scripted protocol-2 server ---------------------------------------------

Handler = Callable[[str, list[Any]], Awaitable[Any]]


def result(**changes: Any) -> dict[str, Any]:
    """An acknowledgement's result, as section 7 says, for USER/1 without since."""
    fields = {"id": "USER/1", "position": "e.10", "recovered": None, "reason": None}
    return {**fields, "criteria_changed": None, "expires_in": 3599, **changes}


@dataclass
class Scripted:
    """A python-socketio server that answers each ``authenticate`` with ``answer`` (its return value
    is the ack's), and records the handshakes' queries and the authentications' arguments."""

    url: str
    sio: socketio.AsyncServer
    queries: list[dict[str, list[str]]] = field(default_factory=list)
    authentications: asyncio.Queue[tuple[str, list[Any]]] = field(default_factory=asyncio.Queue)
    answer: Handler | None = None
    refusal: tuple[Any, ...] = ()

    async def authenticated(self, timeout: float = 15) -> tuple[str, list[Any]]:
        """The next ``authenticate``: its socket and its arguments."""
        return await asyncio.wait_for(self.authentications.get(), timeout)

    async def send(self, sid: str, event: str, payload: Any, meta: dict[str, Any]) -> None:
        await self.sio.emit(event, (payload, meta), to=sid)


@pytest.fixture
async def scripted() -> AsyncIterator[Scripted]:
    sio = socketio.AsyncServer(async_mode="aiohttp")
    app = web.Application()
    sio.attach(app)
    port = free_port()
    server = Scripted(f"http://127.0.0.1:{port}", sio)

    async def connect(sid: str, environ: dict[str, Any], auth: Any = None) -> None:
        server.queries.append(urllib.parse.parse_qs(environ["QUERY_STRING"]))
        if server.refusal:
            raise socketio.exceptions.ConnectionRefusedError(*server.refusal)

    async def authenticate(sid: str, *args: Any) -> Any:
        await server.authentications.put((sid, list(args)))
        return result() if server.answer is None else await server.answer(sid, list(args))

    sio.on("connect", connect)
    sio.on("authenticate", authenticate)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield server
    finally:
        await runner.cleanup()


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def claims(minted: str) -> dict[str, Any]:
    decoded: dict[str, Any] = jwt.decode(minted, SECRET, algorithms=["HS256"])
    return decoded


async def test_it_opts_in_asks_since_and_prints_positions_then_the_last_one(
    scripted: Scripted,
) -> None:
    listening = await Listening.start(
        "--url", scripted.url, "--proto", "2", "--id", "USER/1", "--since", "e.5", "--ttl", "60"
    )
    sid, args = await scripted.authenticated()
    assert scripted.queries[0]["v"] == ["v1"] and scripted.queries[0]["proto"] == ["2"]
    minted, options = args
    assert options == {"since": "e.5"}
    assert claims(minted)["sub"] == "USER/1"
    assert abs(claims(minted)["exp"] - (time.time() + 60)) <= 2
    await listening.until("listening on")
    assert 'authenticated: {"id": "USER/1", "position": "e.10"' in listening.err

    await scripted.send(sid, "greeting", {"text": "hi"}, {"position": "e.11"})
    await scripted.send(sid, "__position", None, {"position": "e.20"})
    await scripted.send(sid, "__gap", None, {"position": "e.30", "reason": "trimmed"})
    await scripted.send(sid, "__position", None, {"position": "e.31"})
    await asyncio.sleep(0.5)
    listening.process.send_signal(signal.SIGINT)
    ended = await listening.end()
    assert ended.code == 0, ended.err
    assert lines(ended.out) == [
        {"event": "greeting", "data": {"text": "hi"}, "position": "e.11", "replayed": False},
        {"event": "__position", "data": None, "position": "e.20"},
        {"event": "__gap", "data": None, "position": "e.30", "reason": "trimmed"},
        {"event": "__position", "data": None, "position": "e.31"},
    ]
    assert ended.err.strip().splitlines()[-1] == (
        "bow-gateway listen: last position e.31 (resume with --since e.31)"
    )
    assert_closed_cleanly(ended)


@pytest.mark.parametrize("ack_first", [True, False])
async def test_a_recovery_keeps_the_last_replayed_position_whenever_the_ack_comes(
    scripted: Scripted, ack_first: bool
) -> None:
    async def replay(sid: str, args: list[Any]) -> Any:
        async def send() -> None:
            for n in (6, 8):
                await scripted.send(sid, "news", {"n": n}, {"position": f"e.{n}", "replayed": True})

        if ack_first:  # the ack first (python-socketio sends it once this returns), then replay
            asyncio.get_running_loop().call_later(0.2, lambda: asyncio.ensure_future(send()))
        else:
            await send()
        return result(position="e.9", recovered=True, criteria_changed=False)

    scripted.answer = replay
    listening = await Listening.start(
        "--url", scripted.url, "--proto", "2", "--id", "USER/1", "--since", "e.5"
    )
    await listening.until("listening on")
    await asyncio.sleep(0.5)
    listening.process.send_signal(signal.SIGTERM)
    ended = await listening.end()
    assert ended.code == 0, ended.err
    assert [(line["data"], line["replayed"]) for line in lines(ended.out)] == [
        ({"n": 6}, True),
        ({"n": 8}, True),
    ]
    assert '"recovered": true' in ended.err
    # Not the ack's e.9: when the ack comes first, e.9 is not reached until the replay ends.
    assert "last position e.8 (resume with --since e.8)" in ended.err


async def test_without_since_it_resumes_after_the_acks_position(scripted: Scripted) -> None:
    listening = await Listening.start("--url", scripted.url, "--proto", "2", "--id", "USER/1")
    _, args = await scripted.authenticated()
    assert args[1] == {}
    await listening.until("listening on")
    listening.process.send_signal(signal.SIGINT)
    ended = await listening.end()
    assert ended.code == 0
    assert ended.out == ""
    assert "last position e.10 (resume with --since e.10)" in ended.err


async def test_asked_to_refresh_it_reauthenticates_with_a_fresh_token(scripted: Scripted) -> None:
    listening = await Listening.start(
        "--url", scripted.url, "--proto", "2", "--id", "USER/1", "--criteria", '{"a": 1}'
    )
    sid, first = await scripted.authenticated()
    await listening.until("listening on")
    await asyncio.sleep(1.1)  # another second: another iat and exp, so another token
    info = {"code": 4100, "reason": "refresh_required", "fatal": False, "reconnect": "new_token"}
    await scripted.sio.emit("alert", ("refresh_required: the token expires", info), to=sid)
    _, again = await scripted.authenticated()
    assert again[1] == {}
    assert again[0] != first[0]
    assert claims(again[0])["sub"] == "USER/1" and claims(again[0])["criteria"] == {"a": 1}
    assert claims(again[0])["exp"] > claims(first[0])["exp"]
    await listening.until("re-authenticated: ")
    await scripted.send(sid, "greeting", None, {"position": "e.12"})
    await asyncio.sleep(0.5)
    listening.process.send_signal(signal.SIGINT)
    ended = await listening.end()
    assert ended.code == 0, ended.err
    assert (
        "alert: refresh_required: the token expires (code 4100 refresh_required, "
        "reconnect: new_token) [not fatal]"
    ) in ended.err
    assert lines(ended.out) == [
        {"event": "greeting", "data": None, "position": "e.12", "replayed": False}
    ]
    assert "last position e.12" in ended.err


async def test_a_given_token_cannot_be_refreshed_and_it_says_so(scripted: Scripted) -> None:
    given = jwt.encode({"sub": "USER/1"}, SECRET, algorithm="HS256")
    listening = await Listening.start("--url", scripted.url, "--proto", "2", "--token", given)
    sid, _ = await scripted.authenticated()
    await listening.until("listening on")
    info = {"code": 4100, "reason": "refresh_required", "fatal": False, "reconnect": "new_token"}
    await scripted.sio.emit("alert", ("refresh_required", info), to=sid)
    await listening.until("bow-gateway listen: cannot refresh a token given with --token")
    await asyncio.sleep(0.3)
    assert scripted.authentications.empty()
    listening.process.send_signal(signal.SIGINT)
    assert (await listening.end()).code == 0


async def test_a_fatal_alert_is_printed_with_its_code_and_advice(scripted: Scripted) -> None:
    listening = await Listening.start("--url", scripted.url, "--proto", "2", "--id", "USER/1")
    sid, _ = await scripted.authenticated()
    await listening.until("listening on")
    info = {"code": 4005, "reason": "kicked", "fatal": True, "reconnect": "never"}
    await scripted.sio.emit("alert", ("kicked: account closed", info), to=sid)
    await scripted.sio.disconnect(sid)
    ended = await listening.end()
    assert ended.code == 1
    assert "alert: kicked: account closed (code 4005 kicked, reconnect: never)\n" in ended.err
    assert "bow-gateway listen: disconnected by the server" in ended.err
    assert_closed_cleanly(ended)


async def test_a_refused_authentication_says_the_code(scripted: Scripted) -> None:
    async def refuse(sid: str, args: list[Any]) -> None:
        info = {"code": 4002, "reason": "auth_refused", "fatal": True, "reconnect": "new_token"}
        await scripted.sio.emit("alert", ("auth_refused: the token was refused", info), to=sid)
        await scripted.sio.disconnect(sid)

    scripted.answer = refuse
    ended = await listen("--url", scripted.url, "--proto", "2", "--id", "USER/1")
    assert ended.code == 1
    assert ended.err.strip().splitlines()[-1] == (
        "bow-gateway listen: authentication refused: auth_refused: the token was refused "
        "(code 4002 auth_refused, reconnect: new_token)"
    )
    assert_closed_cleanly(ended)


async def test_a_connect_error_says_the_code(scripted: Scripted) -> None:
    data = {"code": 4022, "reason": "bad_protocol", "reconnect": "never"}
    scripted.refusal = ("unknown protocol", data)
    ended = await listen("--url", scripted.url, "--proto", "2", "--id", "USER/1")
    assert ended.code == 1
    assert ended.err.strip().splitlines()[-1] == (
        f"bow-gateway listen: {scripted.url}/?v=v1&proto=2 refused the connection: "
        "unknown protocol (code 4022 bad_protocol)"
    )


async def test_anonymous_sends_a_null_token(scripted: Scripted) -> None:
    async def anonymous(sid: str, args: list[Any]) -> Any:
        return result(id=None, expires_in=None)

    scripted.answer = anonymous
    listening = await Listening.start("--url", scripted.url, "--proto", "2", "--anonymous")
    _, args = await scripted.authenticated()
    assert args == [None, {}]
    await listening.until("listening on")
    assert '"id": null' in listening.err
    listening.process.send_signal(signal.SIGINT)
    assert (await listening.end()).code == 0


async def test_a_gateway_without_protocol_2_is_said_and_events_print_as_they_come(
    scripted: Scripted,
) -> None:
    async def protocol_1(sid: str, args: list[Any]) -> None:
        return None  # an ack without a result, as a gateway before protocol 2 sends

    scripted.answer = protocol_1
    listening = await Listening.start("--url", scripted.url, "--proto", "2", "--id", "USER/1")
    sid, _ = await scripted.authenticated()
    await listening.until("listening on")
    assert "this gateway does not speak protocol 2" in listening.err
    await scripted.sio.emit("greeting", {"text": "hi"}, to=sid)
    await asyncio.sleep(0.5)
    listening.process.send_signal(signal.SIGINT)
    ended = await listening.end()
    assert lines(ended.out) == [{"event": "greeting", "data": {"text": "hi"}}]


async def test_without_proto_nothing_of_protocol_2_is_sent(scripted: Scripted) -> None:
    scripted.answer = lambda sid, args: asyncio.sleep(0)  # acks without a result, as protocol 1
    listening = await Listening.start("--url", scripted.url, "--id", "USER/1")
    sid, args = await scripted.authenticated()
    assert "proto" not in scripted.queries[0]
    assert len(args) == 1 and claims(args[0])["sub"] == "USER/1"
    await listening.until("listening on")
    await scripted.send(sid, "greeting", {"text": "hi"}, {"position": "e.11"})
    await asyncio.sleep(0.5)
    listening.process.send_signal(signal.SIGINT)
    ended = await listening.end()
    assert lines(ended.out) == [
        {"event": "greeting", "data": [{"text": "hi"}, {"position": "e.11"}]}
    ]
    assert "position" not in ended.err and "protocol 2" not in ended.err


# -- --proto 2 end to end, against serve -------------------------------------------------------


def acknowledged(err: str, what: str = "authenticated") -> dict[str, Any]:
    """The last acknowledgement's result listen printed on stderr."""
    found = [line for line in err.splitlines() if line.startswith(f"{what}: ")]
    assert found, err
    result: dict[str, Any] = json.loads(found[-1].partition(": ")[2])
    return result


async def test_proto_2_prints_positions_then_recovers_with_since(gateway: Served) -> None:
    team = [{"team": "p2"}]
    args = ("--url", gateway.url, "--proto", "2", "--id", "USER/51", "--criteria", '{"team": "p2"}')
    listening = await Listening.start(*args)
    await listening.until("listening on")
    assert acknowledged(listening.err)["recovered"] is None
    first, first_id = pushed(gateway, "news", team, n=1)
    assert await next_line(listening) == {
        "event": "news",
        "data": {"name": "news", "audience": team, "n": 1},
        "position": first,
        "id": first_id,
        "replayed": False,
    }
    listening.process.send_signal(signal.SIGINT)
    ended = await listening.end()
    assert ended.code == 0, ended.err
    assert f"last position {first} (resume with --since {first})" in ended.err

    missed = [pushed(gateway, "news", team, n=n) for n in (2, 3)]
    push_at(gateway, "news", [{"team": "other"}], n=4)  # not its audience: not replayed
    listening = await Listening.start(*args, "--since", first)
    await listening.until("listening on")
    ack = acknowledged(listening.err)
    assert ack["id"] == "USER/51"
    assert ack["recovered"] is True and ack["reason"] is None
    assert ack["criteria_changed"] is False
    replayed = [await next_line(listening) for _ in missed]
    assert [
        (line["position"], line["id"], line["replayed"], line["data"]["n"]) for line in replayed
    ] == [
        (*missed[0], True, 2),
        (*missed[1], True, 3),
    ]
    live, live_id = pushed(gateway, "news", team, n=5)
    assert await next_line(listening) == {
        "event": "news",
        "data": {"name": "news", "audience": team, "n": 5},
        "position": live,
        "id": live_id,
        "replayed": False,
    }
    listening.process.send_signal(signal.SIGINT)
    ended = await listening.end()
    assert ended.code == 0, ended.err
    assert f"last position {live} (resume with --since {live})" in ended.err
    assert_closed_cleanly(ended)


async def test_proto_2_an_unknown_since_is_not_recovered(gateway: Served) -> None:
    listening = await Listening.start(
        "--url", gateway.url, "--proto", "2", "--id", "USER/52", "--since", "not-a-position"
    )
    await listening.until("listening on")
    ack = acknowledged(listening.err)
    assert ack["recovered"] is False and ack["reason"] == "unknown_position"
    assert isinstance(ack["position"], str)
    assert 3500 < ack["expires_in"] <= 3600
    listening.process.send_signal(signal.SIGINT)
    ended = await listening.end()
    assert ended.code == 0, ended.err
    assert f"last position {ack['position']}" in ended.err


async def test_proto_2_asked_to_refresh_it_mints_and_stays(tmp_path: Path) -> None:
    with serve(tmp_path, BOW_JWT_SECRET=SECRET, BOW_OUTBOUND_EXPIRY_GRACE="1") as served:
        listening = await Listening.start(
            "--url", served.url, "--proto", "2", "--id", "USER/53", "--ttl", "3"
        )
        await listening.until("listening on")
        assert 0 < acknowledged(listening.err)["expires_in"] <= 3
        await listening.until("re-authenticated: ")  # at exp: 4100, a fresh token, the ack
        assert "(code 4100 refresh_required, reconnect: new_token) [not fatal]" in listening.err
        assert acknowledged(listening.err, "re-authenticated")["id"] == "USER/53"
        await asyncio.sleep(2)  # past the first token's exp + grace: still there
        position = push_at(served, "news", [{"__id": "USER/53"}])
        assert (await next_line(listening))["position"] == position
        listening.process.send_signal(signal.SIGINT)
        ended = await listening.end()
    assert ended.code == 0, ended.err
    assert "token_expired" not in ended.err
    assert_closed_cleanly(ended)


async def test_proto_2_a_given_token_expires_after_the_grace(tmp_path: Path) -> None:
    with serve(tmp_path, BOW_JWT_SECRET=SECRET, BOW_OUTBOUND_EXPIRY_GRACE="1") as served:
        given = token("USER/54", ttl=4)  # exp is whole seconds: at least 3 s ahead
        listening = await Listening.start("--url", served.url, "--proto", "2", "--token", given)
        await listening.until("listening on")
        await listening.until("bow-gateway listen: cannot refresh a token given with --token")
        ended = await listening.end()
    assert ended.code == 1
    assert "(code 4003 token_expired, reconnect: new_token)" in ended.err
    assert "bow-gateway listen: disconnected by the server" in ended.err
    assert_closed_cleanly(ended)


async def test_protocol_1_ignores_exp(tmp_path: Path) -> None:
    with serve(tmp_path, BOW_JWT_SECRET=SECRET, BOW_OUTBOUND_EXPIRY_GRACE="1") as served:
        listening = await Listening.start("--url", served.url, "--id", "USER/55", "--ttl", "3")
        await listening.until("listening on")
        await asyncio.sleep(5)  # past exp + grace
        push_at(served, "news", [{"__id": "USER/55"}])
        assert (await next_line(listening))["event"] == "news"
        listening.process.send_signal(signal.SIGINT)
        ended = await listening.end()
    assert ended.code == 0, ended.err
    assert "alert" not in ended.err


def test_listen_drops_a_message_whose_id_it_has_seen_and_remembers_a_bounded_number() -> None:
    recent = RecentIds(size=2)
    assert [recent.first(message_id) for message_id in ("a", "b", "a")] == [True, True, False]
    assert recent.first("c")  # "a" is forgotten now: at most two remembered
    assert recent.first("a") and not recent.first("c")
