"""The lean, guarded Engine.IO transports (bow_gateway/seams/transport.py), and the lifetime of
a connection.

A closed connection must be freed by reference counting alone: objects that ``gc.freeze()`` moved
to the permanent generation are still freed when their count drops to zero, but reference cycles
among them are never collected again. The clients run in a child process, so that only the
gateway's objects are in this one.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import logging
import sys
import warnings
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bow_gateway import Bow
from bow_gateway.core.message import Message, MessageEvent
from bow_gateway.core.names import DISCONNECT

from .support import (
    AUTH,
    PATH,
    Listener,
    base_config,
    read_metric,
    short_heartbeats,
    standard_bow,
    token,
    until,
)

SOCKETS = 30
WAIT = 30.0

# argv: url, mode, one token per socket. Prints "ready", then every socket connects (and, but
# for "refused", authenticates); on the line "close" from stdin, each is closed as the mode says;
# prints "closed" once all are, and exits at EOF.
CLIENTS = r"""
import asyncio, sys
import aiohttp, socketio

URL, MODE, TOKENS = sys.argv[1], sys.argv[2], sys.argv[3:]
TRANSPORTS = {"polling": ["polling"], "upgrade": ["polling", "websocket"]}


async def official(listener_token, commands):
    client = socketio.AsyncClient(reconnection=False)
    gone = asyncio.Event()
    client.on("disconnect", lambda *_: gone.set())
    await client.connect(URL + "?v=1.3", transports=TRANSPORTS.get(MODE, ["websocket"]))
    if MODE != "refused":
        await client.call("authenticate", listener_token, timeout=10)
    if MODE == "upgrade":
        while client.transport() != "websocket":
            await asyncio.sleep(0.02)
    await commands
    if MODE == "refused":
        await client.emit("authenticate", "not-a-token", callback=lambda *_: None)
    elif MODE != "disconnected":  # else the gateway disconnects it
        await client.disconnect()
    await asyncio.wait_for(gone.wait(), 10)


async def silent(listener_token, commands, http):
    # A raw socket that answers pings until told to stop, then only reads.
    ws = await http.ws_connect(URL + "/socket.io/?EIO=4&transport=websocket&v=1.3")
    await ws.receive_str()
    await ws.send_str("40")
    await ws.receive_str()
    await ws.send_str('421["authenticate","%s"]' % listener_token)
    async for message in ws:
        if message.data == "2" and not commands.done():
            await ws.send_str("3")


async def main():
    loop = asyncio.get_running_loop()
    commands = loop.run_in_executor(None, sys.stdin.readline)
    async with aiohttp.ClientSession() as http:
        run = (lambda t: silent(t, commands, http)) if MODE == "silent" else (
            lambda t: official(t, commands))
        sockets = asyncio.gather(*(run(t) for t in TOKENS))
        print("ready", flush=True)  # the test waits until the gateway holds them all
        await sockets
    print("closed", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)


asyncio.run(main())
"""

FAMILIES = {"aiohttp", "asyncio", "bow_gateway", "engineio", "socketio"}


def cyclic_garbage(garbage: list[Any]) -> collections.Counter[str]:
    """Objects of the gateway's libraries among ``garbage``, by type."""
    counts: collections.Counter[str] = collections.Counter()
    for obj in garbage:
        kind = type(obj)
        if kind.__module__.split(".")[0] in FAMILIES:
            counts[f"{kind.__module__}.{kind.__qualname__}"] += 1
    return counts


@pytest.mark.parametrize(
    "mode",
    [
        "websocket",  # the client closes its websocket
        "refused",  # the gateway refuses a token: an alert, then it closes the socket
        "disconnected",  # the gateway closes it: a __disconnect message
        "silent",  # the client stops answering pings
        "killed",  # the client process dies: no close frame
        "upgrade",  # long-polling upgraded to a websocket, closed by the client
        "polling",  # long-polling only, closed by the client
    ],
)
async def test_a_closed_connection_leaves_no_reference_cycles(
    start_bow: Callable[[Bow], Awaitable[Bow]], mode: str
) -> None:
    with warnings.catch_warnings():
        # Regression (a flake): the collections below met transports that earlier tests' clients
        # left unclosed, and their ResourceWarning failed this test.
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    bow = await start_bow(standard_bow(base_config()))
    outbound = bow._outbound
    assert outbound is not None
    outbound.sio.eio.ping_interval, outbound.sio.eio.ping_timeout = 1, 1
    http_server = bow._runners[0].server
    assert http_server is not None
    tokens = [token(f"USER/{n}") for n in range(SOCKETS)]
    clients = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLIENTS,
        f"http://127.0.0.1:{bow.port}",
        mode,
        *tokens,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert clients.stdin is not None and clients.stdout is not None
    try:
        assert await asyncio.wait_for(clients.stdout.readline(), WAIT) == b"ready\n"
        if mode == "refused":
            await until(
                lambda: len(outbound.connections) == SOCKETS, "every socket connected", timeout=WAIT
            )
        else:
            await until(
                lambda: outbound.listener_count() == SOCKETS,
                "every socket authenticated",
                timeout=WAIT,
            )
        sockets = [weakref.ref(socket) for socket in outbound.sio.eio.sockets.values()]
        gc.collect()  # what connecting and authenticating left: gone before a gc.freeze()
        gc.disable()
        try:
            if mode == "killed":
                clients.kill()  # its connections end without a close frame
            else:
                clients.stdin.write(b"close\n")
            if mode == "disconnected":
                audience = [{"__id": f"USER/{n}"} for n in range(SOCKETS)]
                await outbound.delivery.deliver(
                    "-", MessageEvent("1.1", Message(DISCONNECT, audience))
                )
            if mode != "killed":
                assert await asyncio.wait_for(clients.stdout.readline(), WAIT) == b"closed\n"
            await until(
                lambda: (
                    not (outbound.connections or outbound.sio.eio.sockets)
                    and not (http_server.connections or outbound._tasks)
                ),
                "every connection closed",
                timeout=WAIT,
            )
            # engineio's ping checker holds sockets it iterates over, closed ones too, a while
            await outbound.sio.eio.shutdown()
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            left = cyclic_garbage(gc.garbage)
            in_garbage = {id(obj) for obj in gc.garbage}
            held = [ref() for ref in sockets if ref() is not None and id(ref()) not in in_garbage]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    finally:
        clients.stdin.close()
        try:
            await asyncio.wait_for(clients.wait(), WAIT)
        except TimeoutError:
            clients.kill()
            await clients.wait()
    assert len(sockets) == SOCKETS
    assert not held, f"{len(held)} closed sockets still referenced"
    # Before the cycles were broken: 10 to 15 such objects per closed socket.
    total = sum(left.values())
    assert total <= SOCKETS // 10, f"{total} objects in reference cycles: {left.most_common(6)}"


# -- a client that breaks Engine.IO costs only its own connection ------------------------------

WS_PATH = "/socket.io/?EIO=4&transport=websocket&v=1.3"
POLL_PATH = "/socket.io/?EIO=4&transport=polling&v=1.3"
TRANSPORT_LOGGER = "bow_gateway.transport"


async def open_websocket(http: aiohttp.ClientSession, url: str) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect(url + WS_PATH, autoping=False)
    assert (await ws.receive_str(timeout=WAIT)).startswith("0{")  # Engine.IO open
    return ws


async def closed_by_gateway(ws: aiohttp.ClientWebSocketResponse, within: float = 2.0) -> bool:
    """Read until the gateway closes ``ws``; whether it did within ``within`` seconds (sooner
    than the authentication timeout of 5 s)."""
    try:
        while (await ws.receive(timeout=within)).type in (
            aiohttp.WSMsgType.TEXT,
            aiohttp.WSMsgType.BINARY,
        ):
            pass
    except TimeoutError:
        return False
    return True


class Polling:
    """A raw long-polling Engine.IO client: what a test says is all it sends."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url, self.sid = http, url, ""

    async def open(self) -> None:
        async with self.http.get(self.url + POLL_PATH) as response:
            text = await response.text()
        assert text.startswith("0{"), text
        self.sid = json.loads(text[1:])["sid"]

    async def post(self, body: str | bytes) -> int:
        async with self.http.post(self.url + POLL_PATH + f"&sid={self.sid}", data=body) as response:
            await response.read()
            return response.status

    async def poll(self) -> tuple[int, list[str]]:
        async with self.http.get(self.url + POLL_PATH + f"&sid={self.sid}") as response:
            return response.status, (await response.text()).split("\x1e")

    async def listen(self, listener_token: str) -> None:
        """Connect to "/" and authenticate, reading the answers."""
        assert await self.post("40") == 200
        assert (await self.poll())[1][0].startswith("40{")
        assert await self.post(f'421["authenticate","{listener_token}"]') == 200
        assert (await self.poll())[1] == ["431[]"]


def transport_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == TRANSPORT_LOGGER]


async def still_served(bow: Bow, listener: Listener, push: Any) -> None:
    assert listener.client.connected
    await push({"name": "still-here", "audience": [{"__id": "USER/1"}]})
    assert (await listener.next_event())[0] == "still-here"


@pytest.mark.parametrize("frame", ["7", "8", "9", "0", "2", "5", "6"])
async def test_an_engine_io_packet_no_client_sends_closes_that_websocket_with_one_log_line(
    bow: Bow,
    url: str,
    http: aiohttp.ClientSession,
    listeners: Any,
    push: Any,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    frame: str,
) -> None:
    # Regression: each of 20,000 such frames logged a traceback twice (once as plain text
    # around the JSON lines) and the socket stayed open: a 3-5 s stall for every client.
    caplog.set_level(logging.INFO)
    bystander = await listeners("USER/1", {})
    ws = await open_websocket(http, url)
    for _ in range(50):
        await ws.send_str(frame)
    assert await closed_by_gateway(ws)
    await still_served(bow, bystander, push)
    assert len(transport_lines(caplog)) == 1
    assert not [record for record in caplog.records if record.exc_info]
    assert "Traceback" not in capfd.readouterr().err


async def test_an_engine_io_packet_no_client_sends_closes_that_long_polling_connection(
    bow: Bow, url: str, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    client = Polling(http, url)
    await client.open()
    assert await client.post("7") == 400
    assert (await client.poll())[0] == 400  # the session is gone
    assert len(transport_lines(caplog)) == 1
    assert not [record for record in caplog.records if record.exc_info]


async def test_a_binary_websocket_frame_closes_that_websocket(
    bow: Bow, url: str, http: aiohttp.ClientSession, listeners: Any, push: Any
) -> None:
    # Regression: announced attachments and 900 KB binary frames were all kept in memory.
    bystander = await listeners("USER/1", {})
    ws = await open_websocket(http, url)
    await ws.send_str("40")
    assert (await ws.receive_str(timeout=WAIT)).startswith("40{")
    await ws.send_str('451-["authenticate",{"_placeholder":true,"num":0}]')
    await ws.send_bytes(b"\x04" + bytes(1000))
    assert await closed_by_gateway(ws)
    await still_served(bow, bystander, push)


async def test_a_base64_binary_packet_closes_that_long_polling_connection(
    bow: Bow, url: str, http: aiohttp.ClientSession
) -> None:
    client = Polling(http, url)
    await client.open()
    assert await client.post("bAQAAAA=") == 400
    assert (await client.poll())[0] == 400


async def test_a_websocket_message_over_max_incoming_bytes_closes_that_websocket(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(
        standard_bow(base_config(outbound={"timeout": 5, "max_incoming_bytes": 1000}))
    )
    url = f"http://127.0.0.1:{bow.port}"
    ws = await open_websocket(http, url)
    await ws.send_str("4" + "x" * 999)  # 1,000 bytes: taken
    await ws.send_str("3")
    ws2 = await open_websocket(http, url)
    await ws2.send_str("4" + "x" * 1000)
    assert await closed_by_gateway(ws2)
    assert not ws.closed
    await ws.close()


async def test_a_long_polling_post_over_max_incoming_bytes_closes_that_connection(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> None:
    bow = await start_bow(
        standard_bow(base_config(outbound={"timeout": 5, "max_incoming_bytes": 1000}))
    )
    client = Polling(http, f"http://127.0.0.1:{bow.port}")
    await client.open()
    assert await client.post("4" + "x" * 1000) == 400
    assert (await client.poll())[0] == 400


async def test_a_flood_of_packets_closes_that_websocket(
    bow: Bow, url: str, http: aiohttp.ClientSession, listeners: Any, push: Any
) -> None:
    bystander = await listeners("USER/1", {})
    ws = await open_websocket(http, url)
    for _ in range(1000):
        await ws.send_str("3")  # a pong no one asked for, a thousand times at once
    assert await closed_by_gateway(ws)
    await still_served(bow, bystander, push)


async def test_a_poll_response_carries_at_most_what_python_engineio_accepts(
    bow: Bow, url: str, http: aiohttp.ClientSession, push: Any
) -> None:
    # Regression: a poll carried every queued packet; python-engineio's client refuses more
    # than 16, reconnects, and what the response carried was lost (2 of 61 arrived).
    client = Polling(http, url)
    await client.open()
    await client.listen(token("USER/1"))
    await asyncio.gather(
        *(push({"name": "tick", "n": n, "audience": [{"__id": "USER/1"}]}) for n in range(40))
    )
    received: list[str] = []
    while len(received) < 40:
        status, packets = await client.poll()
        assert status == 200 and len(packets) <= 16
        received += packets
    assert sorted(json.loads(packet[2:])[1]["n"] for packet in received) == list(range(40))


async def test_a_long_polling_client_that_stops_polling_is_closed_and_unindexed(
    bow: Bow, url: str, http: aiohttp.ClientSession
) -> None:
    short_heartbeats(bow)
    client = Polling(http, url)
    await client.open()
    await client.listen(token("USER/1"))
    outbound = bow._outbound
    assert outbound is not None and outbound.listener_count() == 1
    await until(lambda: outbound.listener_count() == 0, "the listener unindexed", timeout=WAIT)
    assert not outbound.sio.eio.sockets


async def test_a_long_polling_queue_is_bounded_in_bytes(
    start_bow: Callable[[Bow], Awaitable[Bow]], http: aiohttp.ClientSession
) -> None:
    # Regression: bounded at 1,000 frames, whatever their size (up to ~1 GB per socket).
    config = base_config(outbound={"timeout": 5, "max_buffered_bytes": 10_000})
    bow = await start_bow(standard_bow(config))
    url = f"http://127.0.0.1:{bow.port}"
    client = Polling(http, url)
    await client.open()
    await client.listen(token("USER/1"))
    body = {"name": "big", "blob": "x" * 3_000, "audience": [{"__id": "USER/1"}]}
    for _ in range(5):  # over 10 KB waiting when the fifth comes, never polled
        async with http.post(url + PATH, json=body, headers=AUTH) as response:
            assert response.status == 204
    await until(
        lambda: bow._outbound.listener_count() == 0, "the slow socket dropped", timeout=WAIT
    )  # type: ignore[union-attr]
    assert await read_metric(http, url, 'bow_disconnects_total{reason="slow"}') == 1


async def test_a_long_polling_client_disconnects_promptly(bow: Bow, url: str) -> None:
    # Regression: python-socketio's client waited ~30 s for its last poll to end.
    listener = Listener(url)
    await listener.connect(transports=["polling"])
    await listener.authenticate(token("USER/1"))
    async with asyncio.timeout(3):
        await listener.client.disconnect()


async def test_a_post_whose_first_packet_ends_the_session_is_answered_without_a_crash(
    bow: Bow, url: str, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    # Regression: the malformed "4zz" shut the session, then "5" raised a ProtocolViolation
    # for a session engineio had forgotten: its handler failed (UnboundLocalError), a 500 and
    # an ERROR with a traceback that any client could cause.
    client = Polling(http, url)
    await client.open()
    assert await client.post("4zz\x1e5") != 500
    assert (await client.poll())[0] == 400  # the session is gone
    assert not [record for record in caplog.records if record.exc_info]
