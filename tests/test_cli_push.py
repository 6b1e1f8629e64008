"""``bow-gateway push`` as a real process against a real gateway (in this process, on a free port):
Gobbler's REST publish (``--topic``) and JSON-lines batches (``--batch``); its JSON messages are
in ``test_cli.py``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bow_gateway import Bow, InboundRequest
from bow_gateway.cli import main

from .support import PASSWORD, PATH, base_config, standard_bow
from .support.cli import Result, run
from .support.gobbler_inbound import gobbler_bow
from .support.protocol2 import Listener

StartBow = Callable[[Bow], Awaitable[Bow]]
ADMINS = [{"role": "admin"}]


async def push(url: str, *args: str) -> Result:
    """``bow-gateway push --url URL --password ... ARGS``, run to its end."""
    return await run("push", "--url", url, "--password", PASSWORD, *args)


@pytest.fixture
async def gateway(start_bow: StartBow) -> str:
    """The quick-start gateway: the pass-through inbound at PATH (a list is a batch), which
    takes at most 3 messages a request."""
    bow = await start_bow(standard_bow(base_config(inbound=inbound(max_batch=3))))
    return f"http://127.0.0.1:{bow.port}"


def inbound(**settings: Any) -> dict[str, Any]:
    return {**base_config()["inbound"], **settings}


@pytest.fixture
async def listener(gateway: str) -> AsyncIterator[Listener]:
    made = await Listener().connect(gateway)
    yield made
    await made.client.disconnect()


def jsonl(folder: Path, *lines: Any) -> str:
    """A JSON-lines file of ``lines`` (a string is written as is); its path."""
    path = folder / "messages.jsonl"
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    return str(path)


def greeting(n: int) -> dict[str, Any]:
    return {"name": f"m{n}", "audience": ADMINS, "n": n}


async def test_topic_posts_the_body_raw_to_the_topic_path_with_gobbler_headers_and_ids(
    start_bow: StartBow,
) -> None:
    requests: list[InboundRequest] = []

    def record(request: InboundRequest) -> Any:
        requests.append(request)
        return []

    bow = await start_bow(
        Bow(base_config())
        .middleware(version="v1", create_criteria_from_listener_details=lambda details: {})
        .inbound(
            path="/api/message/{topic:.+}",
            create_message_from_request=record,
            middleware_version="v1",
        )
    )
    result = await push(
        f"http://127.0.0.1:{bow.port}",
        *("--topic", "chat/room 1", "--body", "héllo", "--header", "Key=Value"),
        *("--header", "Trace-Id=7", "--user-id", "marvin", "--message-id", "42"),
    )
    assert (result.code, result.out) == (0, "204 No Content: accepted\n"), result.err
    [request] = requests
    assert dict(request.match_info) == {"topic": "chat/room 1"}
    assert (request.body, request.content_type) == ("héllo".encode(), "text/plain")
    assert (request.headers["X-Gobbler-Key"], request.headers["X-Gobbler-Trace-Id"]) == (
        "Value",
        "7",
    )
    assert dict(request.query) == {"userId": "marvin", "messageId": "42"}


async def test_topic_reaches_a_listener_through_the_gobbler_inbound(start_bow: StartBow) -> None:
    bow = await start_bow(gobbler_bow())
    url = f"http://127.0.0.1:{bow.port}"
    listener = await Listener().connect(url)
    try:
        result = await push(url, "--topic", "chat/room1", "--body", "hello")
        assert result.code == 0, result.err
        name, (payload, _) = await listener.next()
    finally:
        await listener.client.disconnect()
    assert (name, payload) == ("/chat/room1", "hello")


async def test_a_push_retried_with_its_idempotency_key_is_delivered_once(
    gateway: str, listener: Listener
) -> None:
    message = ("--path", PATH, "--name", "shipped", "--audience", json.dumps(ADMINS))
    for _ in range(2):
        result = await push(gateway, *message, "--idempotency-key", "order-17:shipped")
        assert (result.code, result.out) == (0, "204 No Content: accepted\n"), result.err
    await push(gateway, "--path", PATH, "--name", "after", "--audience", json.dumps(ADMINS))
    assert [(await listener.next())[0] for _ in range(2)] == ["shipped", "after"]


async def test_a_malformed_idempotency_key_is_refused_422(gateway: str) -> None:
    args = ("--path", PATH, "--name", "x", "--audience", json.dumps(ADMINS))
    args += ("--idempotency-key", "a b")
    result = await push(gateway, *args)
    assert result.code == 1 and "422" in result.err and "Idempotency-Key" in result.err


async def test_an_idempotency_key_does_not_go_with_batch(gateway: str, tmp_path: Path) -> None:
    result = await push(gateway, "--batch", jsonl(tmp_path, greeting(1)), "--idempotency-key", "k")
    assert result.code == 2 and "--idempotency-key does not go with --batch" in result.err


async def test_batch_sends_the_file_in_order_as_lists_of_at_most_batch_size(
    gateway: str, listener: Listener, tmp_path: Path
) -> None:
    file = jsonl(
        tmp_path, *(greeting(n) for n in range(1, 4)), "", *(greeting(n) for n in range(4, 8))
    )
    result = await push(gateway, "--path", PATH, "--batch", file, "--batch-size", "3")
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        "204 No Content: accepted lines 1-3 (3 messages)",
        "204 No Content: accepted lines 5-7 (3 messages)",
        "204 No Content: accepted lines 8-8 (1 message)",
        "accepted 7 messages in 3 requests",
    ]
    received = [await listener.next() for _ in range(7)]
    assert [(name, data["n"]) for name, (data, _) in received] == [
        (f"m{n}", n) for n in range(1, 8)
    ]


async def test_batch_keeps_each_request_within_batch_bytes(
    gateway: str, listener: Listener, tmp_path: Path
) -> None:
    file = jsonl(tmp_path, *(greeting(n) for n in range(1, 4)))
    line = len(json.dumps(greeting(1)))
    result = await push(
        gateway, "--path", PATH, "--batch", file, "--batch-bytes", str(2 * line + 3)
    )
    assert result.code == 0, result.err
    assert result.out.splitlines()[:2] == [
        "204 No Content: accepted lines 1-2 (2 messages)",
        "204 No Content: accepted lines 3-3 (1 message)",
    ]


async def test_batch_stops_at_a_refusal_saying_what_was_accepted(
    gateway: str, listener: Listener, tmp_path: Path
) -> None:
    lines = [greeting(1), greeting(2), greeting(3), {"name": "", "audience": []}, greeting(5)]
    result = await push(
        gateway, "--path", PATH, "--batch", jsonl(tmp_path, *lines), "--batch-size", "2"
    )
    assert result.code == 1
    assert "422 Unprocessable Entity: 422: invalid message: 1.name: " in result.err, result.err
    assert "(lines 3-4; the 2 messages before them were accepted)" in result.err
    assert [(await listener.next())[0] for _ in range(2)] == ["m1", "m2"]


async def test_a_count_of_one_is_said_in_the_singular(
    gateway: str, listener: Listener, tmp_path: Path
) -> None:
    # Regression: "accepted 1 messages in 1 requests", "the 1 messages before it were accepted".
    file = jsonl(tmp_path, greeting(1))
    result = await push(gateway, "--path", PATH, "--batch", file)
    assert result.code == 0, result.err
    assert result.out.splitlines()[-1] == "accepted 1 message in 1 request"
    file = jsonl(tmp_path, greeting(2), {"name": "", "audience": []})
    refused = await push(gateway, "--path", PATH, "--batch", file, "--batch-size", "1")
    assert refused.code == 1
    assert "(lines 2-2; the 1 message before them was accepted)" in refused.err, refused.err


async def test_batch_with_a_line_that_is_not_json_exits_1_naming_the_line(
    gateway: str, tmp_path: Path
) -> None:
    result = await push(gateway, "--path", PATH, "--batch", jsonl(tmp_path, greeting(1), "{nope"))
    assert result.code == 1
    assert "line 2 of the batch file is not JSON" in result.err, result.err
    assert "(the 0 messages before it were accepted)" in result.err


async def test_a_batch_over_the_inbound_s_max_batch_is_refused_413(
    gateway: str, tmp_path: Path
) -> None:
    result = await push(
        gateway, "--path", PATH, "--batch", jsonl(tmp_path, *(greeting(n) for n in range(4)))
    )
    assert result.code == 1
    assert "413 Request Entity Too Large" in result.err and "inbound.max_batch (3)" in result.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topic", "t", "--name", "n"], "--name does not go with --topic"),
        (["--batch", "f", "--audience", "[]"], "--audience does not go with --batch"),
        (["--batch", "f", "--header", "K=V"], "--header does not go with --batch"),
        (["--name", "n", "--audience", "[]", "--header", "K=V"], "--header goes with --topic"),
        (["--name", "n", "--audience", "[]", "--user-id", "u"], "--user-id goes with --topic"),
        (["--topic", "t", "--batch", "f"], "give --topic or --batch, not both"),
        (["--topic", "t", "--header", "Key"], "--header must look like KEY=VALUE"),
        (["--topic", "t", "--header", "A Key=V"], "--header must look like KEY=VALUE"),
        (["--topic", "/"], "--topic must not be empty"),
        (["--name", "n"], "give --name and --audience (or --topic TOPIC, or --batch FILE)"),
        (["--batch", "/no/such/file.jsonl"], "cannot read --batch /no/such/file.jsonl"),
        (["--batch", "f", "--batch-size", "0"], "not a positive whole number"),
    ],
)
def test_options_that_do_not_go_together_exit_2_with_a_clear_message(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["push", "--url", "http://127.0.0.1:1", *args]) == 2
    assert message in capsys.readouterr().err
