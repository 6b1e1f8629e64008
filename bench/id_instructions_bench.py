"""bow-compare's `id` workload (one message to one listener by ``__id``, a window of messages in
flight) with the gateway under valgrind's callgrind: instructions per message, a figure that
another process's load does not move.

Run:  .venv/bin/python bench/id_instructions_bench.py [--listeners 200] [--messages 4000]
      .venv/bin/python bench/id_instructions_bench.py --gateway /tmp/bow-BASE --gateway /tmp/bow-NEW
      .venv/bin/python bench/id_instructions_bench.py --keyed   # each POST with an Idempotency-Key

A plain script, not a test. For each ``--gateway`` (default: this checkout) it starts the
harness's own ``server_gw.py`` (``../shared/bench/bow-compare/``: the public API only, Basic
Auth, the Redis backplane on a private redis-server) under ``valgrind --tool=callgrind
--instr-atstart=no``, connects ``--listeners`` raw Engine.IO 4 websockets that authenticate as
``user-<i>`` as the harness's ``raw4`` client does, POSTs ``{"name": "msg", "seq": k, "audience":
[{"__id": "user-<k % L>"}]}`` with ``--window`` in flight over as many kept-alive connections,
turns counting on after ``--warmup`` messages and off after ``--messages`` more have been
delivered: instructions (``Ir``) per message of everything the gateway process did meanwhile.
The gateway is saturated under callgrind as it is natively (the window is always full), so its
batches are of the same kind; ~2-3 minutes a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import aiohttp
from lib.callgrind import TOTALS, compare, control
from lib.private_redis import RedisServer, free_port

HARNESS = Path(__file__).resolve().parents[2] / "shared" / "bench" / "bow-compare"
AUTHORIZATION = aiohttp.encode_basic_auth("pusher", "secret")


def start(
    source: str | None, redis: RedisServer, out: Path, harness: Path, cprofile: str | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """``server_gw.py`` under callgrind, counting off (or natively under cProfile, which writes
    its stats when the server stops); (process, port)."""
    port = free_port()
    env = dict(os.environ, REDIS_PORT=str(redis.port), PORT=str(port))
    if source:
        env["PYTHONPATH"] = source
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    command += [f"--callgrind-out-file={out}", sys.executable, str(harness / "server_gw.py")]
    if cprofile:
        command = [sys.executable, "-m", "cProfile", "-o", cprofile, str(harness / "server_gw.py")]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=source or None
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith(b"READY"):
        raise SystemExit(f"the gateway did not start under valgrind: {line!r}")
    return process, port


class Listeners:
    """``count`` raw Engine.IO 4 websockets, each authenticated as ``user-<i>``; counts ``msg``."""

    def __init__(self) -> None:
        self.delivered = 0
        self.tasks: list[asyncio.Task[None]] = []
        self.changed = asyncio.Event()

    async def connect(self, session: aiohttp.ClientSession, port: int, count: int) -> None:
        for i in range(count):
            ready = asyncio.get_running_loop().create_future()
            self.tasks.append(asyncio.create_task(self._run(session, port, i, ready)))
            await asyncio.wait_for(ready, 120)

    async def _run(
        self, session: aiohttp.ClientSession, port: int, i: int, ready: asyncio.Future[None]
    ) -> None:
        url = f"http://127.0.0.1:{port}/socket.io/?EIO=4&transport=websocket&v=v1"
        async with session.ws_connect(
            url, autoping=False, timeout=aiohttp.ClientWSTimeout(120)
        ) as ws:
            async for frame in ws:
                data = frame.data
                if data.startswith("42"):
                    event = json.loads(data[2:])
                    if event[0] == "msg":
                        self.delivered += 1
                        self.changed.set()
                    else:
                        raise SystemExit(f"listener {i}: {event}")
                elif data.startswith("40"):
                    await ws.send_str(f'420["authenticate","user-{i}"]')
                elif data.startswith("43"):
                    ready.set_result(None)
                elif data == "2":
                    await ws.send_str("3")
                elif data.startswith("0"):
                    await ws.send_str("40")
                elif data.startswith("44"):
                    raise SystemExit(f"listener {i} refused: {data}")


async def push(
    session: aiohttp.ClientSession,
    port: int,
    listeners: Listeners,
    first: int,
    count: int,
    size: int,
    window: int,
    keyed: bool = False,
) -> None:
    """POST messages ``first`` .. ``first + count - 1``, ``window`` in flight (``keyed``: each
    with an ``Idempotency-Key`` of its own); back once every one of them is delivered."""
    url = f"http://127.0.0.1:{port}/v1/messages"
    headers = {"Authorization": AUTHORIZATION, "Content-Type": "application/json"}
    queue = iter(range(first, first + count))
    target = listeners.delivered + count

    async def poster() -> None:
        for k in queue:
            body = {"name": "msg", "seq": k, "audience": [{"__id": f"user-{k % size}"}]}
            sent = {**headers, "Idempotency-Key": f"k-{k}"} if keyed else headers
            async with session.post(url, data=json.dumps(body), headers=sent) as response:
                await response.read()
                if response.status != 204:
                    raise SystemExit(f"POST refused: {response.status}")

    await asyncio.gather(*(poster() for _ in range(window)))
    while listeners.delivered < target:
        listeners.changed.clear()
        await asyncio.wait_for(listeners.changed.wait(), 120)


async def measure(source: str | None, args: argparse.Namespace, redis: RedisServer) -> float:
    redis.flush()
    with tempfile.TemporaryDirectory(prefix="id-instructions-") as work:
        out = Path(work) / "callgrind.out"
        process, port = start(source, redis, out, args.harness, args.cprofile)
        profiling = args.cprofile is not None
        try:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                listeners = Listeners()
                await listeners.connect(session, port, args.listeners)
                size, window, keyed = args.listeners, args.window, args.keyed
                await push(session, port, listeners, 0, args.warmup, size, window, keyed)
                if not profiling:
                    control(process.pid, "-i", "on")
                await push(
                    session, port, listeners, args.warmup, args.messages, size, window, keyed
                )
                if not profiling:
                    control(process.pid, "-i", "off")
                    control(process.pid, "--dump")
                for task in listeners.tasks:
                    task.cancel()
        finally:
            process.terminate()
            process.wait(120)
        dumps = list(Path(work).glob("callgrind.out*"))
        if os.environ.get("KEEP"):
            subprocess.run(["cp", "-r", work, os.environ["KEEP"]], check=False)
        total = sum(int(m[1]) for p in dumps for m in [TOTALS.search(p.read_bytes())] if m)
    per_message: float = total / args.messages
    return per_message


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", action="append", help="a checkout (git archive); repeatable")
    parser.add_argument("--listeners", type=int, default=200)
    parser.add_argument("--messages", type=int, default=4_000)
    parser.add_argument("--warmup", type=int, default=1_000)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--keyed", action="store_true", help="every POST with an Idempotency-Key of its own"
    )
    parser.add_argument("--harness", type=Path, default=HARNESS)
    parser.add_argument(
        "--cprofile", help="instead of callgrind: run natively under cProfile, stats written here"
    )
    args = parser.parse_args(argv)
    with RedisServer() as redis:
        compare(args.gateway, args.rounds, lambda source: measure(source, args, redis))
    return 0


if __name__ == "__main__":
    sys.exit(main())
