"""``bow-gateway listen --protocol flywheel|sse`` and ``--topic``, as real processes against a real
``serve`` (its outbound with ``anonymous_criteria``, an expiry grace of 1 s): what each prints for
a push, the refusals in words, the close or the alert that ends it, and SSE resuming by itself."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bow_gateway.cli import main

from .support import SECRET, token
from .support.cli import SHELL_PRELUDE
from .support.cli_listen import Ended, Listening, assert_closed_cleanly, listen, next_line, push_at
from .support.served import BOW_GATEWAY, Served, clean_env, free_port, serve, wait_for_health

ROOT = Path(__file__).resolve().parent.parent
TEAM = [{"team": "cli"}]


def anonymous_config(folder: Path) -> Path:
    """The example configuration; its outbound takes anonymous listeners as ``{"public": true}``."""
    text = (ROOT / "deploy" / "gateway.example.toml").read_text()
    options = 'options = { algorithms = ["HS256"], secret_env = "BOW_JWT_SECRET" }\n'
    assert text.count(options) == 1
    config = folder / "gateway.toml"
    config.write_text(text.replace(options, options + "anonymous_criteria = { public = true }\n"))
    return config


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("serve")
    config = str(anonymous_config(folder))
    with serve(
        folder, "--config", config, BOW_JWT_SECRET=SECRET, BOW_OUTBOUND_EXPIRY_GRACE="1"
    ) as served:
        yield served


def team_listener(served: Served, protocol: str, listener: str) -> tuple[str, ...]:
    """listen's arguments for ``listener`` of team cli, its token minted."""
    criteria = json.dumps(TEAM[0])
    return ("--url", served.url, "--protocol", protocol, "--id", listener, "--criteria", criteria)


async def stop(listening: Listening) -> None:
    """Ctrl-C; it ends with 0 and cleanly."""
    listening.process.send_signal(signal.SIGINT)
    ended = await listening.end()
    assert ended.code == 0, ended.err
    assert_closed_cleanly(ended)


# -- the arguments (in this process: no network) ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topic", "a/#"], "--topic needs --proto 2"),
        (["--proto", "1", "--topic", "a/#"], "--topic needs --proto 2"),
        (["--path", "/broker"], "--path is the Flywheel or SSE endpoint's"),
        (["--protocol", "flywheel", "--proto", "2"], "--proto is Socket.IO's handshake"),
        (["--protocol", "sse", "--proto", "1"], "--proto is Socket.IO's handshake"),
        (["--protocol", "flywheel", "--since", "e.1"], "Flywheel has none"),
    ],
)
def test_options_of_another_protocol_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["listen", "--id", "a", *args]) == 2
    assert message in capsys.readouterr().err


def test_protocol_is_one_of_three(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["listen", "--id", "a", "--protocol", "mqtt"]) == 2
    assert "invalid choice: 'mqtt'" in capsys.readouterr().err


# -- Socket.IO protocol 2: --topic ---------------------------------------------------------------


async def test_socketio_topics_subscribe_before_authenticating(gateway: Served) -> None:
    listening = await Listening.start(
        *team_listener(gateway, "socketio", "USER/60"), "--proto", "2", "--topic", "news/#"
    )
    await listening.until("listening on")
    assert 'subscribed: {"filters": ["news/#"]}' in listening.err
    push_at(gateway, "weather", TEAM)  # its audience, not its topics
    position = push_at(gateway, "news/today", TEAM)
    line = await next_line(listening)
    assert (line["event"], line["position"]) == ("news/today", position)
    await stop(listening)


async def test_socketio_a_bad_topic_is_refused_in_words(gateway: Served) -> None:
    ended = await listen(
        *team_listener(gateway, "socketio", "USER/60"), "--proto", "2", "--topic", "a+"
    )
    assert ended.code == 1
    assert "bow-gateway listen: subscribe refused: " in ended.err
    assert "(code 4000 bad_request)" in ended.err
    assert "listening on" not in ended.err


# -- Flywheel ------------------------------------------------------------------------------------


async def test_flywheel_prints_what_its_topics_match_and_its_direct_messages(
    gateway: Served,
) -> None:
    listening = await Listening.start(
        *team_listener(gateway, "flywheel", "USER/61"), "--topic", "news/#", "--topic", "sport/+"
    )
    await listening.until("listening on ws://127.0.0.1:")
    session = re.search(r" as session (\S+);", listening.err)
    assert session is not None, listening.err
    push_at(gateway, "weather", TEAM)  # its audience, not its topics: Flywheel's rule
    push_at(gateway, "news/today", [{"team": "other"}])  # its topics, not its audience
    push_at(gateway, "news/today", TEAM, n=1)
    assert await next_line(listening) == {
        "event": "news/today",
        "data": {"name": "news/today", "audience": TEAM, "n": 1},
    }
    direct = f"$remote/{session[1]}/rx/hello"
    push_at(gateway, direct, TEAM)  # no subscription needed
    assert (await next_line(listening))["event"] == direct
    await stop(listening)


async def test_flywheel_without_topics_subscribes_to_every_name(gateway: Served) -> None:
    listening = await Listening.start(*team_listener(gateway, "flywheel", "USER/62"))
    await listening.until("listening on")
    push_at(gateway, "anything/at/all", TEAM)
    assert (await next_line(listening))["event"] == "anything/at/all"
    await stop(listening)


async def test_flywheel_says_the_close_code_and_reason(gateway: Served) -> None:
    listening = await Listening.start(*team_listener(gateway, "flywheel", "USER/63"))
    await listening.until("listening on")
    push_at(gateway, "__disconnect", [{"__id": "USER/63"}])
    ended = await listening.end()
    assert ended.code == 1
    assert ended.err.strip().splitlines()[-1] == (
        "bow-gateway listen: closed by the server: a __disconnect message "
        "(code 4006 disconnect_message)"
    )
    assert_closed_cleanly(ended)


async def test_flywheel_a_refused_token_is_said_with_its_code(gateway: Served) -> None:
    ended = await listen("--url", gateway.url, "--protocol", "flywheel", "--token", "not-a-token")
    assert ended.code == 1
    assert "bind error: General: the token was refused" in ended.err
    last = ended.err.strip().splitlines()[-1]
    assert last.startswith("bow-gateway listen: authentication refused: the token was refused")
    assert last.endswith("(code 4002 auth_refused)")
    assert "listening on" not in ended.err
    assert_closed_cleanly(ended)


async def test_flywheel_an_unknown_version_is_said_in_words(gateway: Served) -> None:
    ended = await listen(*team_listener(gateway, "flywheel", "USER/64"), "--version", "v9")
    assert ended.code == 1
    assert ended.err.strip().splitlines()[-1] == (
        f"bow-gateway listen: ws://127.0.0.1:{gateway.port}/broker?v=v9 refused the connection: "
        "unknown outbound version 'v9': this gateway serves v1 (code 4020 unknown_version)"
    )


async def test_flywheel_bind_errors_are_printed_and_the_rest_holds(gateway: Served) -> None:
    listening = await Listening.start(
        *team_listener(gateway, "flywheel", "USER/65"),
        *("--topic", "a/#/b", "--topic", "$SYS/#", "--topic", "ok"),
    )
    await listening.until("listening on")
    assert "bind error: General: bad topic filter: 'a/#/b'" in listening.err
    assert "bind error: TopicAccess '$SYS/#': " in listening.err
    push_at(gateway, "ok", TEAM)
    assert (await next_line(listening))["event"] == "ok"
    await stop(listening)


async def test_flywheel_anonymous_binds_without_auth(gateway: Served) -> None:
    listening = await Listening.start("--url", gateway.url, "--protocol", "flywheel", "--anonymous")
    await listening.until("listening on")
    assert "bind error" not in listening.err
    push_at(gateway, "private", TEAM)
    push_at(gateway, "public", [{"public": True}])
    assert (await next_line(listening))["event"] == "public"
    await stop(listening)


async def test_flywheel_asked_to_refresh_it_rebinds_and_stays(gateway: Served) -> None:
    listening = await Listening.start(*team_listener(gateway, "flywheel", "USER/66"), "--ttl", "3")
    await listening.until("listening on")
    await listening.until("re-authenticated")  # at exp: 4100 on .../rx/alerts, a fresh bind
    assert "(code 4100 refresh_required) [not fatal]" in listening.err
    await asyncio.sleep(2)  # past the first token's exp + grace: still there
    push_at(gateway, "news", [{"__id": "USER/66"}])
    assert (await next_line(listening))["event"] == "news"
    await stop(listening)


# -- Server-Sent Events --------------------------------------------------------------------------


async def test_sse_prints_events_with_their_position_and_resumes_with_since(
    gateway: Served,
) -> None:
    args = team_listener(gateway, "sse", "USER/70")
    listening = await Listening.start(*args, "--topic", "news/#")
    await listening.until("listening on http://127.0.0.1:")
    push_at(gateway, "weather", TEAM)  # its audience, not its topics
    first = push_at(gateway, "news/a", TEAM, n=1)
    assert await next_line(listening) == {
        "event": "news/a",
        "data": {"name": "news/a", "audience": TEAM, "n": 1},
        "position": first,
    }
    listening.process.send_signal(signal.SIGINT)
    ended = await listening.end()
    assert ended.code == 0, ended.err
    assert ended.err.strip().splitlines()[-1] == (
        f"bow-gateway listen: last position {first} (resume with --since {first})"
    )

    missed = push_at(gateway, "news/b", TEAM, n=2)
    listening = await Listening.start(*args, "--topic", "news/#", "--since", first)
    await listening.until("listening on")
    line = await next_line(listening)
    assert (line["event"], line["position"], line["data"]["n"]) == ("news/b", missed, 2)
    await stop(listening)


async def test_sse_an_alert_ends_it_with_the_code(gateway: Served) -> None:
    listening = await Listening.start(*team_listener(gateway, "sse", "USER/71"))
    await listening.until("listening on")
    push_at(gateway, "__disconnect", [{"__id": "USER/71"}])
    ended = await listening.end()
    assert ended.code == 1
    assert "alert: a __disconnect message (code 4006 disconnect_message)\n" in ended.err
    assert "bow-gateway listen: the gateway ended the stream\n" in ended.err
    assert "resuming" not in ended.err
    assert ended.out == ""  # a __disconnect is no event
    assert_closed_cleanly(ended)


async def test_sse_refusals_are_said_with_the_status_and_code(gateway: Served) -> None:
    bad_token, bad_topic = await asyncio.gather(
        listen("--url", gateway.url, "--protocol", "sse", "--token", "not-a-token"),
        listen(*team_listener(gateway, "sse", "USER/72"), "--topic", "a/#/b"),
    )
    assert bad_token.code == bad_topic.code == 1
    assert f"{gateway.url}/events?v=v1 refused the stream: 401: the token was refused" in (
        bad_token.err
    )
    assert "(code 4002 auth_refused)" in bad_token.err
    assert "refused the stream: 400: topic: 'a/#/b'" in bad_topic.err
    assert "(code 4000 bad_request)" in bad_topic.err


async def test_sse_anonymous_sends_no_token(gateway: Served) -> None:
    listening = await Listening.start("--url", gateway.url, "--protocol", "sse", "--anonymous")
    await listening.until("listening on")
    push_at(gateway, "private", TEAM)
    push_at(gateway, "public", [{"public": True}])
    assert (await next_line(listening))["event"] == "public"
    await stop(listening)


async def test_sse_token_expired_reopens_with_a_fresh_token(gateway: Served) -> None:
    listening = await Listening.start(*team_listener(gateway, "sse", "USER/73"), "--ttl", "3")
    await listening.until("listening on")
    await listening.until("bow-gateway listen: reopening with a fresh token")
    assert "(code 4003 token_expired)" in listening.err
    await listening.until("bow-gateway listen: resumed on ")
    push_at(gateway, "news", [{"__id": "USER/73"}])
    assert (await next_line(listening))["event"] == "news"
    await stop(listening)


async def test_sse_a_given_token_that_expires_ends_it(gateway: Served) -> None:
    given = token("USER/74", ttl=5)  # exp is whole seconds: the stream opens well before it
    ended = await listen("--url", gateway.url, "--protocol", "sse", "--token", given)
    assert ended.code == 1
    assert "listening on" in ended.err  # the stream opened: the alert ended it, at exp + grace
    assert "alert: the token expired" in ended.err and "(code 4003 token_expired)" in ended.err
    assert "bow-gateway listen: the gateway ended the stream" in ended.err


async def test_sse_resumes_after_a_stream_that_ends_without_an_alert(tmp_path: Path) -> None:
    """The gateway killed (no alert) and started again on the same port: listen waits, resumes
    with its last id as Last-Event-ID, and the new gateway (another epoch) answers ``__gap``."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def start() -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [*BOW_GATEWAY, "serve", "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=clean_env(BOW_JWT_SECRET=SECRET),
        )
        wait_for_health(url, process)
        return process

    first = await asyncio.to_thread(start)
    try:
        listening = await Listening.start("--url", url, "--protocol", "sse", "--id", "USER/75")
        await listening.until("listening on")
        served = Served(url, port, first, tmp_path / "unused")
        position = push_at(served, "news", [{"__id": "USER/75"}])
        assert (await next_line(listening))["position"] == position
        first.send_signal(signal.SIGKILL)
        await listening.until("bow-gateway listen: the stream ended without an alert")
        assert listening.err.endswith(f"; resuming after {position} in 1 s\n"), listening.err
    finally:
        first.wait(10)
    second = await asyncio.to_thread(start)
    try:
        await listening.until("bow-gateway listen: resumed on ", timeout=30)
        gap = await next_line(listening)
        assert gap["event"] == "__gap", gap
        served = Served(url, port, second, tmp_path / "unused")
        position = push_at(served, "news", [{"__id": "USER/75"}])
        assert (await next_line(listening))["position"] == position
        await stop(listening)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(15)


# -- every protocol ------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["socketio", "flywheel", "sse"])
async def test_a_closed_stdout_ends_it_quietly(gateway: Served, protocol: str) -> None:
    """``listen | head -1``: once its reader is gone, the next event ends it, as ``yes | head``.
    Regression: Socket.IO printed a BrokenPipeError per event and never ended, SSE reconnected
    forever, Flywheel ended with a traceback."""
    reading, writing = os.pipe()
    process = await asyncio.create_subprocess_exec(
        *BOW_GATEWAY,
        "listen",
        *team_listener(gateway, protocol, f"USER/8{len(protocol)}"),
        stdout=writing,
        stderr=asyncio.subprocess.PIPE,
        env=clean_env(BOW_JWT_SECRET=SECRET),
    )
    os.close(writing)
    listening = Listening(process)
    with open(reading, "rb") as out:
        await listening.until("listening on")
        push_at(gateway, "news/1", TEAM)
        first = await asyncio.wait_for(asyncio.to_thread(out.readline), 10)
    assert json.loads(first)["event"] == "news/1"
    for n in range(2, 5):
        push_at(gateway, f"news/{n}", TEAM)
    code = await asyncio.wait_for(process.wait(), 10)
    assert process.stderr is not None
    ended = Ended(code, "", listening.err + (await process.stderr.read()).decode())
    assert ended.code == 1, ended.err
    assert_closed_cleanly(ended)
    assert "BrokenPipe" not in ended.err and "Exception ignored" not in ended.err, ended.err
    assert "resuming" not in ended.err, ended.err


@pytest.mark.parametrize("protocol", ["flywheel", "sse", "socketio"])
async def test_a_graceful_restart_is_followed_by_reconnecting(
    tmp_path: Path, protocol: str
) -> None:
    """4012 (the gateway stops) advises reconnecting now: it does, and receives from the gateway
    started again on the same port, however long that takes. Regressions: SSE, Flywheel and
    Socket.IO's protocol 2 ended there, exit 1; Socket.IO took a first reconnection that found
    no gateway yet for a refusal, and gave up."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def start() -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [*BOW_GATEWAY, "serve", "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=clean_env(BOW_JWT_SECRET=SECRET),
        )
        wait_for_health(url, process)
        return process

    first = await asyncio.to_thread(start)
    try:
        args = ("--url", url, "--protocol", protocol, "--id", "USER/76")
        if protocol == "socketio":
            args += ("--proto", "2")  # protocol 1 has no codes, no advice
        listening = await Listening.start(*args)
        await listening.until("listening on")
        first.send_signal(signal.SIGTERM)  # graceful: every connection gets 4012
        await listening.until("bow-gateway listen: ", timeout=15)
        assert "(code 4012 shutdown)" in listening.err, listening.err
    finally:
        assert await asyncio.to_thread(first.wait, 15) == 0
    await asyncio.sleep(2.5)  # the first reconnection, 1 s after the close, finds no gateway
    second = await asyncio.to_thread(start)
    try:
        again = {
            "sse": "bow-gateway listen: resumed on ",
            "flywheel": "bow-gateway listen: bound",
            "socketio": "authenticated: ",
        }[protocol]
        await listening.until(again, timeout=30)
        served = Served(url, port, second, tmp_path / "unused")
        push_at(served, "news", [{"__id": "USER/76"}])
        line = await next_line(listening)
        if line["event"] == "__gap":  # SSE: the new gateway is another epoch
            line = await next_line(listening)
        assert line["event"] == "news", line
        await stop(listening)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(15)


@pytest.mark.parametrize(
    ("page", "topic"), [("flywheel.md", "quotes/EURUSD"), ("sse.md", "news/a")]
)
async def test_the_listen_line_of_the_docs_works(gateway: Served, page: str, topic: str) -> None:
    found = re.findall(
        r"bow-gateway listen --protocol \w+ [^`\n]*", (ROOT / "docs" / page).read_text()
    )
    assert len(found) == 1, found
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        f"{SHELL_PRELUDE}{found[0]} --url {gateway.url}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean_env(TOKEN=token("USER/67", TEAM[0]), BOW_JWT_SECRET=SECRET),
    )
    listening = Listening(process)
    await listening.until("listening on")
    push_at(gateway, topic, TEAM)
    assert (await next_line(listening))["event"] == topic
    await stop(listening)
