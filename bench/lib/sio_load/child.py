"""A load-generator process of ``redis_bench.py`` (multiprocessing, spawn): its share of the
python-socketio clients, and the books of what they receive, reported over a Unix socket."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import socketio

from lib import proc
from lib.listeners import criteria, listener_id, mint
from lib.machine import raise_open_files_limit
from lib.sio_load import EVENT


def loadgen_main(path: str, index: int, count: int) -> None:
    """A load-generator process: the clients ``i`` with ``i % count == index``."""
    raise_open_files_limit()
    # "packet queue is empty, aborting": a client heard no ping from the gateway for 30 s and
    # gave up; such clients are counted (and reported) after each phase instead.
    logging.getLogger("engineio.client").setLevel(logging.CRITICAL)
    asyncio.run(_loadgen(path, index, count))


async def open_clients(
    command: dict[str, Any],
    mine: list[int],
    receive: Callable[[Any], None],
    clients: list[socketio.AsyncClient],
    failures: list[str],
) -> None:
    """Open and authenticate the clients ``mine``, ``command["concurrency"]`` at a time."""
    urls = command["urls"]
    semaphore = asyncio.Semaphore(command["concurrency"])

    async def open_one(j: int, i: int) -> None:
        client = socketio.AsyncClient(reconnection=False)
        client.on(EVENT, receive)
        token = mint(listener_id(i), command["secret"], criteria(i))
        async with semaphore:
            try:
                await client.connect(
                    f"{urls[j % len(urls)]}?v={command['version']}",
                    transports=["websocket"],
                    wait_timeout=60,
                )
                await client.call("authenticate", token, timeout=60)
            except Exception as error:  # noqa: BLE001 - counted and reported
                failures.append(f"{type(error).__name__}: {error}")
                return
        clients.append(client)

    await asyncio.gather(*(open_one(j, i) for j, i in enumerate(mine)))


class Child:
    """What one load-generator process does, command by command from the benchmark."""

    def __init__(self, writer: asyncio.StreamWriter, index: int, count: int) -> None:
        self.writer, self.index, self.count = writer, index, count
        self.phase = {"id": -1, "expected": 0}
        self.counts: dict[int, int] = {}
        self.book: dict[str, Any] = {}
        self.clients: list[socketio.AsyncClient] = []
        self.mine: list[int] = []
        self.reset()

    def send(self, obj: dict[str, Any]) -> None:
        self.writer.write(json.dumps(obj).encode() + b"\n")

    def reset(self) -> None:
        self.book.update(latencies=[], deliveries=0, late=0, last=0)
        self.counts.clear()

    def receive(self, data: Any) -> None:
        now = time.monotonic_ns()
        book = self.book
        if data.get("p") != self.phase["id"]:
            book["late"] += 1
            return
        book["latencies"].append(now - data["t"])
        book["deliveries"] += 1
        book["last"] = now
        seq = data["seq"]
        got = self.counts.get(seq, 0) + 1
        if got >= self.phase["expected"]:
            self.counts.pop(seq, None)
            self.writer.write(b"D %d\n" % seq)
        else:
            self.counts[seq] = got

    async def connect(self, command: dict[str, Any]) -> None:
        self.mine = list(range(self.index, command["n"], self.count))
        failures: list[str] = []
        rss_before = proc.rss_kib()["VmRSS"]
        cpu_before = time.process_time()
        await open_clients(command, self.mine, self.receive, self.clients, failures)
        gc.collect()
        gc.freeze()  # keep this process's full collections out of the latencies
        self.send(
            {
                "op": "connected",
                "n": len(self.clients),
                "g10": sum(1 for i in self.mine if criteria(i)["g10"]),
                "failures": len(failures),
                "failure": failures[0] if failures else None,
                "cpu": time.process_time() - cpu_before,
                "rss_kib": proc.rss_kib()["VmRSS"] - rss_before,
            }
        )

    def start_phase(self, command: dict[str, Any]) -> None:
        self.reset()
        self.phase["id"] = command["p"]
        self.phase["expected"] = command["expected"]
        self.send({"op": "ready"})

    def end(self) -> None:
        self.phase["id"] = -1
        book = self.book
        self.send(
            {
                "op": "result",
                "latencies": book["latencies"],
                "deliveries": book["deliveries"],
                "late": book["late"],
                "last": book["last"],
                "disconnected": sum(1 for c in self.clients if not c.connected),
            }
        )
        self.reset()

    async def close(self) -> None:
        self.send({"op": "closed"})
        await self.writer.drain()
        self.writer.close()
        # No graceful disconnect: the gateways are stopped next and close every socket.
        os._exit(0)


async def _loadgen(path: str, index: int, count: int) -> None:
    reader, writer = await asyncio.open_unix_connection(path, limit=1 << 24)
    child = Child(writer, index, count)
    child.send({"op": "hello", "index": index, "pid": os.getpid()})
    while True:
        line = await reader.readline()
        if not line:
            break
        command = json.loads(line)
        op = command["op"]
        if op == "connect":
            await child.connect(command)
        elif op == "phase":
            child.start_phase(command)
        elif op == "end":
            child.end()
        elif op == "close":
            await child.close()
        await writer.drain()
