"""Acknowledgements and receipts (contract section 17): ``Bow-Receipt``, protocol-2 Socket.IO
acknowledgements, ``GET /_bow/receipts/{id}`` on one instance and summed over two through Redis,
and ``Bow.receipt``."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow

from .support import AUTH, PATH, WAIT, token
from .support.mixed_clients import VERSION, Mixed, next_seen

StartBow = Callable[[Bow], Awaitable[Bow]]
FX = {"desk": "fx"}
TO_FX = [{"desk": "fx"}]


@pytest.fixture
def gateways(
    serve_mixed: Callable[..., Awaitable[Mixed]],
) -> Callable[..., Awaitable[Mixed]]:
    """``await gateways(**config)``: a running gateway of every protocol (conftest)."""
    return serve_mixed


async def push(
    gateway: Mixed, audience: list[dict[str, Any]], headers: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """POST a message ``news``; ``(status, Bow-Message-Id or the refusal's text, position)``."""
    body = {"name": "news", "payload": {"n": 1}, "audience": audience}
    async with gateway.http.post(
        gateway.url + PATH, json=body, headers={**AUTH, **(headers or {})}
    ) as response:
        if response.status != 204:
            return response.status, await response.text(), ""
        return 204, response.headers["Bow-Message-Id"], response.headers["Bow-Position"]


async def receipt(gateway: Mixed, message_id: str) -> tuple[int, Any]:
    async with gateway.http.get(
        f"{gateway.url}/_bow/receipts/{message_id}", headers=AUTH
    ) as response:
        if response.status == 200:
            return 200, await response.json()
        return response.status, await response.text()


async def final(gateway: Mixed, message_id: str, within: float = 10.0) -> dict[str, Any]:
    """The receipt once final and complete (fails past ``within`` seconds)."""
    deadline = time.monotonic() + within
    while True:
        status, answer = await receipt(gateway, message_id)
        if status == 200 and answer["state"] == "final" and answer["complete"]:
            return dict(answer)
        assert time.monotonic() < deadline, (status, answer)
        await asyncio.sleep(0.1)


async def eventually(
    check: Callable[[], Awaitable[bool]], what: str, *, timeout: float = 5.0
) -> None:
    """Ask ``check`` every 20 ms until it holds; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        await asyncio.sleep(0.02)


async def raw_listener(
    gateway: Mixed, listener_id: str, criteria: dict[str, Any]
) -> aiohttp.ClientWebSocketResponse:
    """A protocol-2 socket spoken to in raw Engine.IO frames: it never acknowledges unless the
    test sends the ACK itself (a socket.io-client whose handler never calls its callback)."""
    ws = await gateway.http.ws_connect(
        f"{gateway.url}/socket.io/?EIO=4&transport=websocket&v={VERSION}&proto=2"
    )
    assert (await ws.receive_str(timeout=WAIT)).startswith("0{")
    await ws.send_str("40")
    assert (await ws.receive_str(timeout=WAIT)).startswith("40{")
    await ws.send_str(f'421["authenticate","{token(listener_id, criteria)}"]')
    assert (await ws.receive_str(timeout=WAIT)).startswith("431[")
    return ws


async def next_event(ws: aiohttp.ClientWebSocketResponse) -> str:
    """The next Socket.IO EVENT's frame (Engine.IO pings answered on the way)."""
    while True:
        frame = await ws.receive_str(timeout=WAIT)
        if frame == "2":
            await ws.send_str("3")
        elif frame.startswith("42"):
            return frame


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({"Bow-Receipt": "0"}, "Bow-Receipt must be whole seconds from 1 to 3600"),
        ({"Bow-Receipt": "3601"}, "Bow-Receipt must be whole seconds from 1 to 3600"),
        ({"Bow-Receipt": "1.5"}, "Bow-Receipt must be whole seconds from 1 to 3600"),
        ({"Bow-Receipt": "soon"}, "Bow-Receipt must be whole seconds from 1 to 3600"),
        ({"Bow-Fallback": "-3"}, "Bow-Fallback must be whole seconds from 1 to 3600"),
        ({"Bow-Receipt": "5", "Bow-Fallback": "6"}, "Bow-Fallback implies Bow-Receipt"),
    ],
)
async def test_a_bad_receipt_header_is_422_naming_it(
    gateways: Callable[..., Awaitable[Mixed]], headers: dict[str, str], why: str
) -> None:
    gateway = await gateways()
    status, text, _ = await push(gateway, TO_FX, headers)
    assert status == 422 and why in text, (status, text)


async def test_a_message_without_bow_receipt_has_no_receipt_and_no_ack_id(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    ws = await raw_listener(gateway, "USER/1", FX)
    status, message_id, _ = await push(gateway, TO_FX)
    assert status == 204
    assert (await next_event(ws)).startswith('42["news"')  # no id between 42 and [
    await asyncio.sleep(0.5)  # past the first report a receipt would have had
    assert (await receipt(gateway, message_id))[0] == 404


async def test_an_unknown_message_id_is_404(gateways: Callable[..., Awaitable[Mixed]]) -> None:
    gateway = await gateways()
    status, text = await receipt(gateway, "nosuchmessage1")
    assert status == 404 and "no receipt" in text


async def test_a_protocol_2_event_asks_for_an_ack_only_with_a_receipt(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    ws = await raw_listener(gateway, "USER/1", FX)
    await push(gateway, TO_FX, {"Bow-Receipt": "30"})
    frame = await next_event(ws)
    ack_id, _, rest = frame[2:].partition("[")
    assert ack_id.isdigit(), frame
    assert json.loads("[" + rest)[0] == "news"


async def test_a_receipt_counts_matched_delivered_and_acked_sockets_and_lists_their_ids(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    acking = await gateway.socketio("USER/1", FX)  # python-socketio acknowledges every event
    silent = await raw_listener(gateway, "USER/2", FX)
    stream = await gateway.sse("USER/3", FX)
    status, message_id, position = await push(gateway, TO_FX, {"Bow-Receipt": "2"})
    assert status == 204
    await next_seen(acking)
    await next_event(silent)
    await next_seen(stream)
    await eventually(_acked(gateway, message_id, 1), "the acknowledgement in the receipt")
    status, answer = await receipt(gateway, message_id)
    assert status == 200
    assert answer == {
        "id": message_id,
        "position": position,
        "state": "open",
        "matched": 3,
        "delivered": 3,
        "acked": 1,
        "listeners": {
            "delivered": ["USER/1", "USER/2", "USER/3"],
            "acked": ["USER/1"],
            "missed": [],
        },
        "complete": False,
    }
    done = await final(gateway, message_id)
    assert done["state"] == "final" and done["complete"] is True
    assert (done["matched"], done["delivered"], done["acked"]) == (3, 3, 1)


def _acked(gateway: Mixed, message_id: str, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        status, answer = await receipt(gateway, message_id)
        return status == 200 and answer["acked"] == count

    return check


async def test_missed_lists_the_ids_named_by_the_audience_that_got_nothing(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    await gateway.socketio("USER/1", FX)
    audience = [{"__id": "USER/1"}, {"__id": "USER/404"}, {"__id": 7, "desk": "fx"}]
    status, message_id, _ = await push(gateway, audience, {"Bow-Receipt": "1"})
    assert status == 204
    done = await final(gateway, message_id)
    assert done["listeners"]["delivered"] == ["USER/1"]
    assert done["listeners"]["missed"] == ["USER/404", 7]


async def test_a_receipt_exists_within_a_second_even_when_nothing_matched(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    status, message_id, _ = await push(gateway, [{"desk": "nobody"}], {"Bow-Receipt": "60"})
    assert status == 204
    started = time.monotonic()
    await eventually(_exists(gateway, message_id), "the receipt", timeout=1.0)
    assert time.monotonic() - started < 1.0
    answer = (await receipt(gateway, message_id))[1]
    assert (answer["state"], answer["matched"], answer["delivered"]) == ("open", 0, 0)


def _exists(gateway: Mixed, message_id: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await receipt(gateway, message_id))[0] == 200

    return check


async def test_an_ack_for_an_id_never_delivered_to_that_socket_is_not_counted(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    target = await raw_listener(gateway, "USER/1", FX)
    other = await raw_listener(gateway, "USER/2", {"desk": "eq"})
    _, message_id, _ = await push(gateway, TO_FX, {"Bow-Receipt": "1"})
    ack_id = (await next_event(target))[2:].partition("[")[0]
    await other.send_str(f"43{ack_id}[]")  # USER/2 was never sent it
    await other.send_str("43999999[]")  # an id never given out
    done = await final(gateway, message_id)
    assert (done["delivered"], done["acked"]) == (1, 0)
    assert done["listeners"]["acked"] == []


async def test_an_ack_counts_once_and_not_after_the_window(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    early = await raw_listener(gateway, "USER/1", FX)
    late = await raw_listener(gateway, "USER/2", FX)
    _, message_id, _ = await push(gateway, TO_FX, {"Bow-Receipt": "1"})
    early_id = (await next_event(early))[2:].partition("[")[0]
    late_id = (await next_event(late))[2:].partition("[")[0]
    await early.send_str(f"43{early_id}[]")
    await early.send_str(f"43{early_id}[]")  # twice: still one socket
    await asyncio.sleep(1.2)
    await late.send_str(f"43{late_id}[]")  # after the window
    done = await final(gateway, message_id)
    assert (done["acked"], done["listeners"]["acked"]) == (1, ["USER/1"])


async def test_a_long_polling_socket_acknowledges_too(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    from .support.protocol2 import P2

    client = P2(gateway.url)
    try:
        await client.connect("2", version=VERSION, transport="polling")
        await client.authenticate(token("USER/1", FX))
        _, message_id, _ = await push(gateway, TO_FX, {"Bow-Receipt": "1"})
        await client.expect("news")
        done = await final(gateway, message_id)
        assert (done["delivered"], done["acked"]) == (1, 1)
    finally:
        await client.close()


async def test_lists_past_receipts_max_ids_are_null_with_exact_counts(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways(receipts={"max_ids": 2})
    clients = [await gateway.socketio(f"USER/{n}", FX) for n in range(3)]
    _, message_id, _ = await push(gateway, TO_FX, {"Bow-Receipt": "1"})
    for client in clients:
        await next_seen(client)
    done = await final(gateway, message_id)
    assert (done["delivered"], done["acked"]) == (3, 3)
    assert done["listeners"]["delivered"] is None and done["listeners"]["acked"] is None


async def test_bow_publish_with_a_receipt_and_bow_receipt(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    client = await gateway.socketio("USER/1", FX)
    message_id, position = await gateway.bow.publish({"name": "news", "audience": TO_FX}, receipt=1)
    await next_seen(client)
    deadline = time.monotonic() + 10
    while (answer := await gateway.bow.receipt(message_id)) is None or not answer["complete"]:
        assert time.monotonic() < deadline, answer
        await asyncio.sleep(0.1)
    assert (answer["position"], answer["delivered"], answer["acked"]) == (position, 1, 1)
    assert await gateway.bow.receipt("unknown1") is None
    with pytest.raises(ValueError, match="Bow-Receipt must be whole seconds"):
        await gateway.bow.publish({"name": "news", "audience": TO_FX}, receipt=0)


async def test_two_instances_report_one_receipt(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    config = {"redis": "redis://127.0.0.1:6379/0", "namespace": f"receipts-{uuid.uuid4().hex[:8]}"}
    first, second = await gateways(**config), await gateways(**config)
    one = await first.socketio("USER/1", FX)
    two = await second.socketio("USER/2", FX)
    three = await second.flywheel("USER/3", FX, subscribe=["news"])
    _, message_id, _ = await push(first, TO_FX, {"Bow-Receipt": "1"})
    for client in (one, two, three):
        await next_seen(client)
    done = await final(second, message_id)
    assert (done["matched"], done["delivered"], done["acked"]) == (3, 3, 2)
    assert done["listeners"]["delivered"] == ["USER/1", "USER/2", "USER/3"]
    assert done == await final(first, message_id)


async def test_an_instance_gone_before_the_end_leaves_the_receipt_incomplete(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    config = {"redis": "redis://127.0.0.1:6379/0", "namespace": f"receipts-{uuid.uuid4().hex[:8]}"}
    first, second = await gateways(**config), await gateways(**config)
    await second.socketio("USER/2", FX)
    status, message_id, _ = await push(first, TO_FX, {"Bow-Receipt": "2"})
    await eventually(_delivered(first, message_id, 1), "the second's report")
    await second.close()
    await second.bow.stop()  # before the end: it never reports final
    await asyncio.sleep(3.5)
    status, answer = await receipt(first, message_id)
    assert status == 200 and answer["state"] == "final"
    assert answer["complete"] is False and answer["missing_instances"] == 1
    assert answer["delivered"] == 1  # what it reported while it lived stays


def _delivered(gateway: Mixed, message_id: str, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        status, answer = await receipt(gateway, message_id)
        return status == 200 and answer["delivered"] == count

    return check


async def test_acknowledgements_asked_for_do_not_count_against_the_packet_rate(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    """Regression: every acknowledgement took a token of the client's packet rate (20 a second
    past a burst of 100), so a listener acknowledging a busy stream of receipts was closed 4011
    ``flood``."""
    gateway = await gateways()
    client = await gateway.socketio("USER/1", FX)  # acknowledges every one
    for _ in range(300):
        status, _, _ = await push(gateway, TO_FX, {"Bow-Receipt": "60"})
        assert status == 204
    for _ in range(300):
        await next_seen(client)
    await asyncio.sleep(0.3)  # the last acknowledgements read
    assert client.alerts == [] and not client.disconnected.is_set()


async def test_a_receipt_is_404_once_receipts_ttl_has_passed_after_its_end(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways(receipts={"ttl": 0.5})
    _, message_id, _ = await push(gateway, TO_FX, {"Bow-Receipt": "1"})
    assert (await final(gateway, message_id))["state"] == "final"
    await asyncio.sleep(1.0)  # the end (1 s after acceptance) plus the ttl, passed
    assert (await receipt(gateway, message_id))[0] == 404


async def test_every_message_of_a_batch_has_a_receipt(
    gateways: Callable[..., Awaitable[Mixed]],
) -> None:
    gateway = await gateways()
    client = await gateway.socketio("USER/1", FX)
    batch = [{"name": "one", "audience": TO_FX}, {"name": "two", "audience": [{"__id": "X"}]}]
    async with gateway.http.post(
        gateway.url + PATH, json=batch, headers={**AUTH, "Bow-Receipt": "1"}
    ) as response:
        status, ids = response.status, response.headers.get("Bow-Message-Ids", "")
    assert status == 204, status
    first, second = ids.split(", ")
    await next_seen(client)
    one, two = await final(gateway, first), await final(gateway, second)
    assert (one["delivered"], one["acked"]) == (1, 1)
    assert (two["delivered"], two["listeners"]["missed"]) == (0, ["X"])
