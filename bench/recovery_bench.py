"""Protocol 2's recovery: what replaying 1,000 messages from a window of 10,000 costs the gateway.

Run:  .venv/bin/python bench/recovery_bench.py [--rounds 5] [--window 10000] [--replay 1000]
      .venv/bin/python bench/recovery_bench.py --profile /tmp/recovery.prof   # + cProfile

A plain script, not a test (issue 13, "Done when" (b): at most 50 ms of gateway CPU). It starts
``lib/gateway.py`` (JWT outbound v1.3, claims middleware, pass-through inbound, in-process
backplane, recovery at its defaults: ``max_count`` 10,000, ``max_age`` 120 s, ``max_replay``
1,000) in a process of its own pinned to CPU 0, and pins itself to CPU 1. Then, ``--rounds``
times:

1. one message to nobody (``[{"__id": "nobody"}]``): its ``Bow-Position`` is ``since``;
2. ``--window`` messages (the window then holds exactly those: the marker has just left it, as
   the last position forgotten, from which a recovery is still complete), of which ``--replay``
   match listener ``bench-1`` (criteria ``{"all": true, "g10": false, "role": "author"}``):
   alternately ``[{"__id": "bench-1"}]`` and ``[{"role": "author"}]``, the others
   ``[{"__id": "bench-<k>"}]``, ``[{"role": "admin"}]``, ``[{"g10": true}]`` and
   ``[{"all": false}]``, so that every one of the window's messages costs an audience check;
   payloads of ``--payload`` bytes; POSTed 16 at a time;
3. the gateway's CPU time (``cpu``: ``CLOCK_PROCESS_CPUTIME_ID`` of the gateway process, in ns,
   read through ``lib/gateway.py``'s control channel, so it is exact, not in 10 ms ticks) and its
   stall probe are read; a lean protocol-2 websocket client (``lib.lean.websocket.LeanClient``:
   ``&proto=2``, ``authenticate`` with ``(token, {"since": since}, ack)``) connects, and the
   measurement ends when it has read the ack and every replayed event; the gateway's CPU time is
   read again. The client checks the ack (``recovered: true``) and that it received exactly the
   expected positions, in order, each with ``replayed: true``;
4. the same listener connects again without ``since``: the CPU of a bare connect + authenticate
   (the baseline to subtract; its own criteria event then takes a place in the next window).

Printed per round: the ack, the gateway CPU of the recovery and of the bare connection, their
difference (what the recovery itself costs), the wall time from the TCP connect to the last
replayed event, and the gateway's longest event-loop stall meanwhile. The exit status is 1 when a
recovery did not recover everything or the median recovery costs more than ``--target-ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lib import listeners, machine, stats
from lib.gateways import Gateways
from lib.lean.books import EVENT
from lib.lean.posters import Poster, Posters
from lib.lean.recovering import RecoveringClient
from lib.variants import source_variant, start_variant

LISTENER = 1  # bench-1: {"all": true, "g10": false, "role": "author"}
MATCHING = (b'[{"__id":"bench-1"}]', b'[{"role":"author"}]')
OTHERS = (b'[{"role":"admin"}]', b'[{"g10":true}]', b'[{"all":false}]')


def audience(k: int, every: int) -> bytes:
    """Message ``k`` of a window: every ``every``-th matches bench-1, the others do not."""
    if k % every == 0:
        return MATCHING[(k // every) % 2]
    choice = k % 4
    if choice == 3:
        return b'[{"__id":"bench-%d"}]' % (1000 + k)
    return OTHERS[choice]


async def post_window(posters: Posters, count: int, every: int, body: bytes) -> int:
    """POST ``count`` messages, 16 at a time; the number that failed."""
    failed = 0
    queue = iter(range(count))

    async def worker() -> None:
        nonlocal failed
        for k in queue:
            payload = b'{"name":"%s","audience":%s,"payload":%s}' % (
                EVENT.encode(),
                audience(k, every),
                body % k,
            )
            if await posters.post(payload) != 204:
                failed += 1

    await asyncio.gather(*(worker() for _ in range(16)))
    return failed


def header(head: bytes, name: bytes) -> str | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name.lower():
            return value.strip().decode()
    return None


async def connect(
    host: str, port: int, client: RecoveringClient, timeout: float = 60.0
) -> tuple[float, float]:
    """Open ``client``; (perf_counter at the start, at the end)."""
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    await loop.create_connection(lambda: client, host, port)
    ended = await asyncio.wait_for(client.done, timeout)
    return started, ended


@dataclass
class Target:
    """The gateway under test, and what every round POSTs to it."""

    gateways: Gateways
    host: str
    port: int
    posters: Posters
    marker: Poster  # the message to nobody whose position is ``since``
    token: str  # bench-1's
    body: bytes  # a payload, % k
    every: int  # one message of a window in ``every`` matches bench-1

    async def command(self, text: str) -> dict[str, Any]:
        return (await self.gateways.command(text))[0]


async def bench(args: argparse.Namespace, gateways: Gateways) -> list[dict[str, Any]]:
    port = int(gateways.socket_urls[0].rsplit(":", 1)[1])
    host = args.host
    posters = Posters(host, port)
    posters.grow(16)
    marker = Poster(f"{host}:{port}", posters.authorization)
    await asyncio.get_running_loop().create_connection(lambda: marker, host, port)
    token = listeners.token(LISTENER)
    # payload: {"k": <n>, "text": "xxx..."}, about --payload bytes
    body = b'{"k":%d,"text":"' + b"x" * max(0, args.payload - 20) + b'"}'
    target = Target(gateways, host, port, posters, marker, token, body, args.window // args.replay)
    rounds = []
    for round_ in range(args.rounds):
        row = await one_round(args, target, round_)
        rounds.append(row)
        print(
            f"  round {round_ + 1}: window of {row['window']:,} (posted in "
            f"{row['posted in']:.1f} s, {row['failed posts']} failed); ack {row['ack']}; replayed "
            f"{row['replayed']:,} of {row['expected']:,} ({'ok' if row['ok'] else 'WRONG'}); "
            f"gateway CPU {row['recovery cpu'] * 1e3:.1f} ms "
            f"(bare connect + authenticate {row['bare cpu'] * 1e3:.1f} ms); wall "
            f"{row['recovery wall'] * 1e3:.1f} ms; longest stall {row['stall'] * 1e3:.1f} ms, "
            f"longest GC {row['gc'] * 1e3:.1f} ms (collections by generation "
            f"{row['gc by generation']}, {row['gc seconds'] * 1e3:.1f} ms in all)",
            flush=True,
        )
    return rounds


async def post_round(args: argparse.Namespace, target: Target) -> tuple[str, int, float, int]:
    """The marker, then the window: (since, messages failed, seconds posting, expected)."""
    status = await target.marker.post(
        b'{"name":"%s","audience":[{"__id":"nobody"}]}' % EVENT.encode()
    )
    since = header(target.marker.head, b"bow-position")
    if status != 204 or not since:
        raise SystemExit(f"the marker message got {status}, Bow-Position {since!r}")
    count, every = args.window, target.every
    started = time.perf_counter()
    failed = await post_window(target.posters, count, every, target.body)
    posting = time.perf_counter() - started
    expected = sum(1 for k in range(count) if k % every == 0)
    return since, failed, posting, expected


async def one_round(args: argparse.Namespace, target: Target, round_: int) -> dict[str, Any]:
    host, port, token, command = target.host, target.port, target.token, target.command
    since, failed, posting, expected = await post_round(args, target)
    await asyncio.sleep(args.settle)  # the gateway has delivered (to nobody) every message
    if args.collect_first:  # the POSTs' garbage out of the way: the recovery's own cost
        await command("collect")
        await asyncio.sleep(args.settle)  # and the gateway's freeze after it
    await command("stall")
    await command("gc")
    if args.profile:
        os.kill(target.gateways.pids[0], signal.SIGUSR1)
    cpu_before = (await command("cpu"))["cpu_ns"]
    client = RecoveringClient(f"{host}:{port}", token, {"since": since}, expected)
    begun, ended = await connect(host, port, client)
    cpu_after = (await command("cpu"))["cpu_ns"]
    if args.profile:
        os.kill(target.gateways.pids[0], signal.SIGUSR2)
    stall = (await command("stall"))["stall"]["longest"]
    collections = (await command("gc"))["gc"]
    client.close()
    await asyncio.sleep(0.2)
    # the baseline: the same listener, a bare connect + authenticate
    bare = RecoveringClient(f"{host}:{port}", token, {}, 0)
    bare_before = (await command("cpu"))["cpu_ns"]
    bare_begun, bare_ended = await connect(host, port, bare)
    bare_after = (await command("cpu"))["cpu_ns"]
    bare.close()
    await asyncio.sleep(0.2)
    result = client.result if isinstance(client.result, dict) else {}
    positions = [p for p, replayed in client.events if replayed]
    ok = (
        result.get("recovered") is True
        and client.replayed == expected
        and len(positions) == len(set(positions))
        and all(replayed for _, replayed in client.events[:expected])
    )
    return {
        "round": round_ + 1,
        "window": args.window,
        "posted in": posting,
        "failed posts": failed,
        "ack": {k: result.get(k) for k in ("recovered", "reason", "position")},
        "expected": expected,
        "replayed": client.replayed,
        "live": len(client.events) - client.replayed,
        "ok": ok,
        "recovery cpu": (cpu_after - cpu_before) / 1e9,
        "bare cpu": (bare_after - bare_before) / 1e9,
        "recovery wall": ended - begun,
        "bare wall": bare_ended - bare_begun,
        "stall": stall,
        "gc": max(collections["longest"]),
        "gc by generation": collections["collections"],
        "gc seconds": sum(collections["seconds"]),
    }


def print_summary(rounds: list[dict[str, Any]], target_ms: float) -> bool:
    headers = [
        "round",
        "window",
        "replayed",
        "recovered",
        "gateway CPU",
        "bare connect+auth",
        "recovery alone",
        "per replayed msg",
        "wall (connect to last)",
        "longest stall",
        "longest GC",
        "GC in all (gen 0/1/2 collections)",
    ]
    rows = []
    for r in rounds:
        alone = r["recovery cpu"] - r["bare cpu"]
        rows.append(
            [
                str(r["round"]),
                f"{r['window']:,}",
                f"{r['replayed']:,} / {r['expected']:,}",
                "yes" if r["ok"] else "NO",
                f"{r['recovery cpu'] * 1e3:.1f} ms",
                f"{r['bare cpu'] * 1e3:.1f} ms",
                f"{alone * 1e3:.1f} ms",
                f"{alone * 1e6 / max(r['replayed'], 1):.1f} µs",
                f"{r['recovery wall'] * 1e3:.1f} ms",
                f"{r['stall'] * 1e3:.1f} ms",
                f"{r['gc'] * 1e3:.1f} ms",
                f"{r['gc seconds'] * 1e3:.1f} ms ({'/'.join(map(str, r['gc by generation']))})",
            ]
        )
    print(stats.table(headers, rows))
    cpu = [r["recovery cpu"] * 1e3 for r in rounds]
    median = statistics.median(cpu)
    met = median <= target_ms and all(r["ok"] for r in rounds)
    print(
        f"gateway CPU of a recovery (connect + authenticate + recover + replay): median "
        f"{median:.1f} ms, range {min(cpu):.1f}-{max(cpu):.1f} ms; target {target_ms:g} ms: "
        + ("MET" if met else "MISSED")
    )
    return met


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window", type=int, default=10_000, help="messages after since")
    parser.add_argument("--replay", type=int, default=1_000, help="of which match the listener")
    parser.add_argument("--payload", type=int, default=200, help="bytes of each payload")
    parser.add_argument("--settle", type=float, default=1.0, help="s after posting")
    parser.add_argument("--target-ms", type=float, default=50.0)
    parser.add_argument("--profile", help="cProfile the gateway during the recoveries (a file)")
    parser.add_argument("--source", help="another checkout's gateway (see fanout_bench.py)")
    parser.add_argument(
        "--collect-first",
        action="store_true",
        help="gc.collect() in the gateway before each recovery (what the POSTs left is then "
        "not collected during the recovery)",
    )
    parser.add_argument(
        "--no-gc-freeze", action="store_true", help="the gateway without gc_freeze (an experiment)"
    )
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--quiet", type=float, default=30.0, help="s to wait for a quiet machine")
    args = parser.parse_args(argv)
    if args.window % args.replay:
        parser.error("--window must be a multiple of --replay")

    print(machine.environment(["aiohttp", "python-socketio", "python-engineio", "PyJWT"]))
    print(f"bow_gateway: {args.source or machine.git_state()}")
    os.sched_setaffinity(0, {args.client_cpu})
    if args.quiet > 0:
        machine.wait_for_quiet(args.quiet)
    workdir = tempfile.mkdtemp(prefix="recovery-")
    variant = source_variant(args.source, 2, workdir)
    extra = ["--profile", args.profile] if args.profile else []
    if args.no_gc_freeze:
        extra.append("--no-gc-freeze")
    gateways = start_variant(variant, None, "recovery", extra)
    machine.pin_gateway(gateways.pids[0], args.server_cpu)
    print(
        f"gateway: {gateways.description}, pinned to CPU {args.server_cpu}; this process on CPU "
        f"{args.client_cpu}; {args.rounds} rounds of {args.replay:,} of {args.window:,} "
        f"messages of ~{args.payload} bytes",
        flush=True,
    )
    try:
        rounds = asyncio.run(bench(args, gateways))
        counters = asyncio.run(gateways.command("recoveries"))[0]
    finally:
        gateways.stop()
    print(f"the gateway's recovery metrics: {counters.get('recoveries')}")
    met = print_summary(rounds, args.target_ms)
    if args.profile:
        print(f"cProfile of the recoveries (the last round only): {args.profile}")
    print(f"load average now: {machine.load_average()}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
