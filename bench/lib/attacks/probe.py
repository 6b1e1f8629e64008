"""The honest listener of ``attack_bench.py``, and a message to it every interval, timed."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import aiohttp
import socketio

from lib import gateway, stats
from lib.attacks import EVENT, HONEST, INBOUND, VERSION
from lib.attacks.wire import gateway_token


class Probe:
    """One honest listener, and a message to it every ``interval`` s, timed end to end."""

    def __init__(self, url: str, interval: float) -> None:
        self.url = url
        self.interval = interval
        self.token = gateway_token(HONEST, {"role": "honest"})
        self.sent: dict[int, int] = {}  # seq -> ns, monotonic, just before its POST
        self.status: dict[int, int] = {}  # seq -> HTTP status (0: no answer)
        self.received: dict[int, int] = {}  # seq -> ns, monotonic, when the listener got it
        self.disconnects: list[float] = []  # monotonic s of each disconnection
        self.seq = 0
        self.client: socketio.AsyncClient | None = None
        self.gone = asyncio.Event()
        self.auth = {"Authorization": aiohttp.encode_basic_auth(gateway.USER, gateway.PASSWORD)}
        self.tasks: set[asyncio.Task[None]] = set()

    async def connect(self) -> None:
        client = socketio.AsyncClient(reconnection=False)
        client.on(EVENT, self._on_probe)
        client.on("disconnect", self._on_disconnect)
        await client.connect(f"{self.url}?v={VERSION}", transports=["websocket"], wait_timeout=30)
        await client.call("authenticate", self.token, timeout=30)
        self.client = client
        self.gone.clear()

    def _on_probe(self, data: Any) -> None:
        now = time.monotonic_ns()
        if isinstance(data, dict) and isinstance(data.get("seq"), int):
            self.received.setdefault(data["seq"], now)

    def _on_disconnect(self, *args: Any) -> None:
        self.disconnects.append(time.monotonic())
        self.gone.set()

    async def keep_connected(self) -> None:
        while True:
            await self.gone.wait()
            try:
                await self.connect()
            except Exception as error:  # noqa: BLE001 - retried, and counted as a disconnection
                print(f"  (honest listener: reconnect failed: {error!r})", flush=True)
                await asyncio.sleep(0.5)

    async def post_forever(self, http: aiohttp.ClientSession) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            seq = self.seq
            self.seq += 1
            task = asyncio.create_task(self._post(http, seq))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            due += self.interval
            await asyncio.sleep(max(0.0, due - loop.time()))

    async def _post(self, http: aiohttp.ClientSession, seq: int) -> None:
        self.sent[seq] = sent = time.monotonic_ns()
        body = {"name": EVENT, "audience": [{"__id": HONEST}], "seq": seq, "t": sent}
        try:
            async with http.post(self.url + INBOUND, json=body, headers=self.auth) as response:
                await response.read()
                self.status[seq] = response.status
        except (TimeoutError, aiohttp.ClientError, OSError):
            self.status[seq] = 0

    def settled(self, first: int, last: int) -> bool:
        """Every message of [first, last) answered, and delivered if accepted."""
        return all(
            seq in self.status and (self.status[seq] != 204 or seq in self.received)
            for seq in range(first, last)
        )

    async def settle(self, first: int, last: int, limit: float) -> None:
        deadline = time.monotonic() + limit
        while not self.settled(first, last) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def window(self, first: int, last: int, started: float, ended: float) -> dict[str, Any]:
        seqs = range(first, last)
        latencies = [(self.received[s] - self.sent[s]) / 1e6 for s in seqs if s in self.received]
        receipts = sorted(self.received[s] for s in seqs if s in self.received)
        gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(receipts)]
        worst = max(latencies, default=float("nan"))
        gap = max(gaps, default=float("nan"))
        return {
            "messages": len(seqs),
            "p50": stats.percentile(latencies, 0.5),
            "p99": stats.percentile(latencies, 0.99),
            "worst": worst,
            "gap": gap,
            "stall": max(worst, gap - self.interval * 1000),
            "lost": sum(self.status.get(s) == 204 and s not in self.received for s in seqs),
            "refused": sum(self.status.get(s, 0) != 204 for s in seqs),
            "disconnects": sum(started <= t <= ended for t in self.disconnects),
        }
