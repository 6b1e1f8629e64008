"""The gateway's instructions per message, counted by valgrind's callgrind: a figure that
another process's load does not move, for before/after comparisons on a busy machine.

Run:  .venv/bin/python bench/instructions_bench.py [--messages 20000] [--batch 100]
      .venv/bin/python bench/instructions_bench.py --gateway /tmp/bow-BASE --gateway /tmp/bow-NEW

A plain script, not a test. For each ``--gateway`` (default: this checkout) it starts
``lib/gateway.py`` as ``history_bench.py`` does (JWT outbound, envelope inbound taking batches,
the Redis backplane on a private redis-server, a ``[[history]]`` rule keeping ``chat/#``) under
``valgrind --tool=callgrind --instr-atstart=no``, connects one protocol-2 subscriber (criteria
``{"room": 1}``), warms up, then turns counting on (``callgrind_control -i on``), POSTs
``--messages`` retained messages to ``chat/room1`` in batches of ``--batch`` with ``--posters``
connections (1: each batch is then read back whole by one ``XREAD``), each POST sent once the
subscriber has every message of the last ones, turns counting off and reads the total:
instructions (``Ir``) per message, everything the gateway process executed meanwhile (inbound,
backplane writes and reads, delivery, the event loop), and nothing it did before. With one
poster the same run twice gives the same figure within ~1% however busy the machine is; with
several, how the batches meet in the gateway moves it by up to 10%. Wall time is ~50x the
native one: 20,000 messages take a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp
from lib import gateway, gateways
from lib.callgrind import TOTALS, compare, control
from lib.histories.messages import batch_body
from lib.histories.subscriber import Subscriber, subscribe
from lib.private_redis import RedisServer


def start(
    source: str | None, redis: RedisServer, out: Path, cprofile: str | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """``lib/gateway.py`` under callgrind, counting off (or natively, with cProfile); (process,
    port)."""
    namespace = "instructions"
    rules = [{"filter": "chat/#", "max_count": 1_000_000, "max_age": 86_400}]
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    command += [f"--callgrind-out-file={out}"]
    script = str(gateways.SCRIPT)
    command = (
        [sys.executable, script, "--profile", cprofile]
        if cprofile
        else [*command, sys.executable, script]
    )
    command += ["--namespace", namespace, "--redis", redis.url, "--envelope"]
    command += ["--history", json.dumps(rules)]
    env = dict(os.environ)
    if source:
        env["PYTHONPATH"] = source
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=source or None,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise SystemExit("the gateway did not start under valgrind")
    started = json.loads(line)
    if source and not started.get("bow_gateway", "").startswith(source):
        process.kill()
        raise SystemExit(f"the gateway imported {started.get('bow_gateway')}, not {source}")
    return process, int(started["port"])


async def post_all(
    url: str, subscriber: Subscriber, messages: int, batch: int, posters: int
) -> None:
    """POST ``messages`` in batches, ``posters`` at a time, each round once all are delivered."""
    authorization = aiohttp.encode_basic_auth(gateway.USER, gateway.PASSWORD)
    async with aiohttp.ClientSession(headers={"Authorization": authorization}) as s:
        sent = 0
        while sent < messages:
            round_ = min(posters, (messages - sent + batch - 1) // batch)
            bodies = [batch_body("chat/room1", batch) for _ in range(round_)]

            async def post(body: bytes) -> None:
                headers = {"Content-Type": "application/json"}
                for _ in range(20):  # a 503 (the slowed gateway's publish timeout): again
                    async with s.post(url, data=body, headers=headers) as response:
                        text = await response.text()
                        if response.status == 204:
                            return
                        if response.status != 503:
                            raise SystemExit(f"POST refused: {response.status} {text}")
                    await asyncio.sleep(0.5)
                raise SystemExit("POST refused 20 times with 503")

            await asyncio.gather(*(post(body) for body in bodies))
            sent += round_ * batch
            deadline = time.monotonic() + 120
            while subscriber.count < sent:
                if time.monotonic() > deadline:
                    raise SystemExit(f"only {subscriber.count} of {sent} delivered")
                await asyncio.sleep(0.01)


async def measure(source: str | None, args: argparse.Namespace, redis: RedisServer) -> float:
    redis.flush()
    with tempfile.TemporaryDirectory(prefix="instructions-") as work:
        out = Path(work) / "callgrind.out"
        process, port = start(source, redis, out, args.cprofile)
        try:
            subscriber = await subscribe(port, "chat/room1", "instructions")
            url = f"http://127.0.0.1:{port}{gateway.PATH}"
            await post_all(url, subscriber, args.warmup, args.batch, args.posters)
            base = subscriber.count
            if args.cprofile:
                os.kill(process.pid, signal.SIGUSR1)
            else:
                control(process.pid, "-i", "on")
            await post_all(url, subscriber, base + args.messages, args.batch, args.posters)
            if args.cprofile:
                os.kill(process.pid, signal.SIGUSR2)
                await asyncio.sleep(1)
            else:
                control(process.pid, "-i", "off")
                control(process.pid, "--dump")
            if subscriber.transport is not None:
                subscriber.transport.close()
        finally:
            process.terminate()
            process.wait(120)
        dumps = sorted(Path(work).glob("callgrind.out*"), key=lambda p: p.stat().st_mtime)
        if os.environ.get("KEEP"):
            subprocess.run(["cp", "-r", work, "/tmp/instructions-kept"], check=False)
        total = sum(int(m[1]) for p in dumps for m in [TOTALS.search(p.read_bytes())] if m)
    per_message: float = total / args.messages
    return per_message


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", action="append", help="a checkout (git archive); repeatable")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--posters", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--cprofile", help="instead of callgrind: run natively and write cProfile's stats here"
    )
    args = parser.parse_args(argv)
    with RedisServer(aof=True) as redis:
        compare(args.gateway, args.rounds, lambda source: measure(source, args, redis))
    return 0


if __name__ == "__main__":
    sys.exit(main())
