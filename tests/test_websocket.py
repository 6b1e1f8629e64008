"""The lean Engine.IO transport (bow_gateway/websocket.py) and the lifetime of a connection.

A closed connection must be freed by reference counting alone: objects that ``gc.freeze()`` moved
to the permanent generation are still freed when their count drops to zero, but reference cycles
among them are never collected again. The clients run in a child process, so that only the
gateway's objects are in this one.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import sys
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bow_gateway import Bow
from bow_gateway.message import DISCONNECT, Message, MessageEvent

from .support import base_config, standard_bow, token

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


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(int(WAIT / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"never happened: {what}")


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
            await until(lambda: len(outbound.connections) == SOCKETS, "every socket connected")
        else:
            await until(lambda: outbound.listener_count() == SOCKETS, "every socket authenticated")
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
                await outbound.deliver(MessageEvent("1.1", Message(DISCONNECT, audience)))
            if mode != "killed":
                assert await asyncio.wait_for(clients.stdout.readline(), WAIT) == b"closed\n"
            await until(
                lambda: (
                    not (outbound.connections or outbound.sio.eio.sockets)
                    and not (http_server.connections or outbound._tasks)
                ),
                "every connection closed",
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
