"""Issue 29's figures: what an ``Idempotency-Key`` costs, and how fast ``/_bow/presence`` answers.

Run:  .venv/bin/python bench/feedback_bench.py                      # both parts, ~3 min
      .venv/bin/python bench/feedback_bench.py --parts keys --rounds 5 --backplanes redis
      .venv/bin/python bench/feedback_bench.py --parts presence --listeners 10000

A plain script, not a test. Every gateway is ``lib/gateway.py`` (this tree's, or ``--gateway``'s,
a ``git archive`` snapshot) in a process of its own pinned to ``--server-cpu``; this process, its
lean clients and the private redis-server run on ``--client-cpu``.

``keys``: ``--sockets`` lean Socket.IO protocol-2 listeners on one gateway (the in-process
backplane, then a private redis-server: ``--backplanes``); messages to one listener by ``__id``
POSTed by ``--window`` workers over keep-alive connections (each worker's message in flight until
its 204 and its delivery), without and with an ``Idempotency-Key`` (``k-<n>``, fresh for each
message), the two variants alternating over ``--rounds``. Printed: the gateway's CPU per message
(``CLOCK_PROCESS_CPUTIME_ID``, exact) per variant and round, keyed / unkeyed per round; checked:
every POST answered 204, every message delivered once. Target: keyed <= 1.10 x unkeyed (the median
of the rounds' ratios).

``presence``: two gateways sharing one private redis-server, ``--listeners`` authenticated
protocol-2 listeners split over them (criteria ``{"all": true, ...}``), then ``POST
/_bow/presence`` with the audience ``[{"all": true}]`` and each of ``--limits`` (``--requests``
each, the instances in turn, paced under ``api.max_counts_per_second``) and ``POST /_bow/online``
with every id: latency median and max. Target: presence under ``--target-ms`` (100) at 10,000
listeners over two instances. The exit status is 1 when a target is missed or a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from lib import gateway, listeners, machine, stats
from lib.gateways import Gateways
from lib.lean.books import EVENT, Books, monotonic_ns
from lib.lean.connect import factory
from lib.lean.posters import Poster
from lib.lean.websocket import LeanClient
from lib.private_redis import RedisServer
from lib.variants import Variant, source_variant, start_variant

VARIANTS = ("unkeyed", "keyed")
LENGTH = b"Content-Length: "


class KeyedPoster(Poster):
    """A :class:`Poster` that can add an ``Idempotency-Key`` header to a POST."""

    async def post_keyed(self, body: bytes, key: bytes | None) -> int:
        if key is None:
            return await self.post(body)
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        head = self._head[: -len(LENGTH)] + b"Idempotency-Key: " + key + b"\r\n" + LENGTH
        self.transport.write(head + b"%d\r\n\r\n" % len(body) + body)
        return await self._waiter


async def open_listeners(
    books: Books, host: str, port: int, first: int, count: int, concurrency: int
) -> list[LeanClient]:
    """Connect and authenticate listeners ``first..first+count-1`` (protocol 2), retrying a
    refusal (the gateway's connect-rate limit) after 1-2 s; stop if one never gets in."""
    loop = asyncio.get_running_loop()
    semaphore = asyncio.Semaphore(concurrency)
    clients: list[LeanClient] = []

    async def one(i: int) -> None:
        token = listeners.token(i)
        for _ in range(30):
            client = LeanClient(books, f"{host}:{port}", token, 2)
            async with semaphore:
                try:
                    await loop.create_connection(factory(client), host, port)
                    await asyncio.wait_for(client.ready, 60)
                except (OSError, TimeoutError):
                    client.close()
                else:
                    clients.append(client)
                    return
            await asyncio.sleep(1.0 + random.random())
        raise SystemExit(f"listener {i} could not connect: {client.reason}")

    await asyncio.gather(*(one(i) for i in range(first, first + count)))
    return clients


def identity(poster: KeyedPoster) -> KeyedPoster:  # create_connection's protocol factory
    return poster


def close_all(books: Books, clients: Sequence[LeanClient]) -> None:
    books.closing = True
    for client in clients:
        client.close()


@dataclass
class KeysRun:
    """One gateway of the ``keys`` part, its listeners and the POSTing connections."""

    gateways: Gateways
    host: str
    port: int
    sockets: int
    books: Books = field(default_factory=Books)
    posters: list[KeyedPoster] = field(default_factory=list)
    seq: int = 0

    async def cpu_ns(self) -> int:
        return int((await self.gateways.command("cpu"))[0]["cpu_ns"])

    async def send(self, count: int, keyed: bool) -> tuple[int, int]:
        """POST ``count`` messages, one in flight per poster; (not 204, not delivered in 10 s)."""
        queue = iter(range(count))
        failures = [0, 0]
        books, loop = self.books, asyncio.get_running_loop()

        def settle(done: asyncio.Future[None]) -> None:
            if not done.done():
                done.set_result(None)

        async def worker(poster: KeyedPoster) -> None:
            for _ in queue:
                self.seq += 1
                seq, sent, done = self.seq, monotonic_ns(), loop.create_future()
                message = books.expect(seq, sent, 1, functools.partial(settle, done))
                body = b'{"name":"%s","audience":[{"__id":"%s"}],"seq":%d,"t":%d}' % (
                    EVENT.encode(),
                    listeners.listener_id(seq % self.sockets).encode(),
                    seq,
                    sent,
                )
                if await poster.post_keyed(body, b"k-%d" % seq if keyed else None) != 204:
                    failures[0] += 1
                    books.finish(message, books.last)
                    continue
                try:
                    await asyncio.wait_for(done, 10)
                except TimeoutError:
                    failures[1] += 1
                    books.finish(message, books.last)

        await asyncio.gather(*(worker(poster) for poster in self.posters))
        return failures[0], failures[1]


async def keys_gateway(args: argparse.Namespace, run: KeysRun) -> list[dict[str, Any]]:
    """Listeners, posters, a warm-up, then ``--rounds`` of both variants, alternating."""
    clients = await open_listeners(
        run.books, run.host, run.port, 0, run.sockets, args.connect_concurrency
    )
    loop = asyncio.get_running_loop()
    authorization = aiohttp.encode_basic_auth(gateway.USER, gateway.PASSWORD)
    for _ in range(args.window):
        poster = KeyedPoster(f"{run.host}:{run.port}", authorization)
        await loop.create_connection(functools.partial(identity, poster), run.host, run.port)
        run.posters.append(poster)
    for variant in VARIANTS:
        await run.send(args.warmup, variant == "keyed")
    results = []
    for round_ in range(1, args.rounds + 1):
        order = VARIANTS if round_ % 2 else VARIANTS[::-1]
        for variant in order:
            late = run.books.late
            before, started = await run.cpu_ns(), time.perf_counter()
            not_204, missing = await run.send(args.messages, variant == "keyed")
            wall, after = time.perf_counter() - started, await run.cpu_ns()
            results.append(
                {
                    "round": round_,
                    "variant": variant,
                    "us": (after - before) / 1e3 / args.messages,
                    "rate": args.messages / wall,
                    "not_204": not_204,
                    "missing": missing,
                    "duplicates": run.books.late - late,
                }
            )
    close_all(run.books, clients)
    return results


def keys_part(args: argparse.Namespace, variant: Variant) -> bool:
    met = True
    for backplane in args.backplanes:
        redis = RedisServer(cpu=args.client_cpu) if backplane == "redis" else None
        gateways = start_variant(variant, redis, "feedback-keys")
        machine.pin_gateway(gateways.pids[0], args.server_cpu)
        port = int(gateways.socket_urls[0].rsplit(":", 1)[1])
        print(f"\nkeys, {backplane}: {gateways.description}", flush=True)
        try:
            run = KeysRun(gateways, args.host, port, args.sockets)
            results = asyncio.run(keys_gateway(args, run))
        finally:
            gateways.stop()
            if redis is not None:
                redis.stop()
        met = print_keys(backplane, results, args.target_ratio) and met
    return met


def print_keys(backplane: str, results: list[dict[str, Any]], target: float) -> bool:
    headers = ["round", "variant", "gateway µs/msg", "msgs/s", "not 204", "missing", "duplicates"]
    rows = [
        [str(r["round"]), r["variant"], f"{r['us']:.1f}", f"{r['rate']:,.0f}"]
        + [str(r[k]) for k in ("not_204", "missing", "duplicates")]
        for r in results
    ]
    print(stats.table(headers, rows))
    by: dict[str, list[float]] = {
        v: [r["us"] for r in results if r["variant"] == v] for v in VARIANTS
    }
    ratios = [k / u for u, k in zip(by["unkeyed"], by["keyed"], strict=True)]
    for variant in VARIANTS:
        values = by[variant]
        print(f"  {variant}: min {min(values):.1f}, median {statistics.median(values):.1f} µs/msg")
    clean = all(r["not_204"] == r["missing"] == r["duplicates"] == 0 for r in results)
    ratio = statistics.median(ratios)
    met = ratio <= target and clean
    print(
        f"  {backplane}: keyed / unkeyed per round {' / '.join(f'{x:.3f}' for x in ratios)}, "
        f"median {ratio:.3f} (of the medians "
        f"{statistics.median(by['keyed']) / statistics.median(by['unkeyed']):.3f}); "
        f"every POST 204 and every message once: {'yes' if clean else 'NO'}; "
        f"target <= {target:g}: {'MET' if met else 'MISSED'}",
        flush=True,
    )
    return met


async def timed(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    """POST ``body``, retrying a 429 after 0.2 s; (seconds of the answered request, its JSON)."""
    while True:
        started = time.perf_counter()
        async with session.post(url, json=body) as response:
            answer: dict[str, Any] = await response.json() if response.status == 200 else {}
            took = time.perf_counter() - started
            if response.status == 429:
                await asyncio.sleep(0.2)
                continue
            if response.status != 200:
                raise SystemExit(f"{url} answered {response.status}: {await response.text()}")
            return took, answer


async def presence_requests(
    args: argparse.Namespace, urls: list[str], total: int
) -> list[tuple[str, list[float], bool]]:
    """Each request ``--requests`` times over the instances in turn: (what, seconds, all ok)."""
    everyone = [{"all": True}]
    asks: list[tuple[str, str, dict[str, Any], int]] = [
        (f"presence, limit {limit:,}", "/presence", {"audience": everyone, "limit": limit}, limit)
        for limit in args.limits
    ]
    ids = [listeners.listener_id(i) for i in range(total)]
    asks.append((f"online, {total:,} ids", "/online", {"ids": ids}, total))
    rows = []
    authorization = aiohttp.encode_basic_auth(gateway.USER, gateway.PASSWORD)
    async with aiohttp.ClientSession(headers={"Authorization": authorization}) as session:
        for what, path, body, expected in asks:
            seconds, ok = [], True
            for k in range(args.requests):
                took, answer = await timed(session, urls[k % len(urls)] + "/_bow" + path, body)
                seconds.append(took)
                if path == "/online":
                    ok = ok and answer.get("complete") is True and answer["online"] == ids
                else:
                    ok = ok and answer.get("complete") is True and answer["sockets"] == total
                    ok = ok and len(answer["listeners"]) == min(expected, total)
                await asyncio.sleep(args.pace)
            rows.append((what, seconds, ok))
    return rows


async def presence_run(
    args: argparse.Namespace, instances: list[Gateways]
) -> list[tuple[str, list[float], bool]]:
    books = Books()
    share, clients = args.listeners // len(instances), []
    started = time.perf_counter()
    for k, instance in enumerate(instances):
        port = int(instance.socket_urls[0].rsplit(":", 1)[1])
        clients += await open_listeners(
            books, args.host, port, k * share, share, args.connect_concurrency
        )
    print(
        f"  {len(clients):,} listeners authenticated in {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    await asyncio.sleep(args.settle)
    rows = await presence_requests(args, [g.socket_urls[0] for g in instances], share * 2)
    close_all(books, clients)
    return rows


def presence_part(args: argparse.Namespace, variant: Variant) -> bool:
    redis = RedisServer(cpu=args.client_cpu)
    instances: list[Gateways] = []
    try:
        for _ in range(2):
            instances.append(start_variant(variant, redis, "feedback-presence"))
            machine.pin_gateway(instances[-1].pids[0], args.server_cpu)
        print(f"\npresence: {'; '.join(g.description for g in instances)}", flush=True)
        rows = asyncio.run(presence_run(args, instances))
    finally:
        for instance in instances:
            instance.stop()
        redis.stop()
    headers, ms = (
        ["request", "median", "min", "max", "answers right"],
        (statistics.median, min, max),
    )
    table = [[w, *(f"{f(s) * 1e3:.1f} ms" for f in ms), "yes" if ok else "NO"] for w, s, ok in rows]
    print(stats.table(headers, table))
    presence = [s for what, s, _ in rows if what.startswith("presence")]
    worst = max(statistics.median(s) for s in presence)
    met = worst < args.target_ms and all(ok for *_, ok in rows)
    print(
        f"  presence at {args.listeners:,} listeners over two instances: the slowest median "
        f"{worst * 1e3:.1f} ms; target < {args.target_ms:g} ms: {'MET' if met else 'MISSED'}",
        flush=True,
    )
    return met


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0] + " Parts: keys (the gateway's CPU per "
        "message to one listener by __id, without and with an Idempotency-Key; target keyed <= "
        "1.10 x unkeyed) and presence (POST /_bow/presence and /_bow/online latency with "
        "10,000 listeners over two instances sharing Redis; target under 100 ms).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--parts", default="keys,presence", help="keys, presence or both")
    parser.add_argument("--gateway", help="a snapshot's directory (git archive) to run")
    parser.add_argument("--backplanes", default="memory,redis", help="keys: memory, redis")
    parser.add_argument("--rounds", type=int, default=3, help="keys: rounds of both variants")
    parser.add_argument("--sockets", type=int, default=1_000, help="keys: listeners")
    parser.add_argument("--messages", type=int, default=20_000, help="keys: per variant a round")
    parser.add_argument("--warmup", type=int, default=2_000, help="keys: per variant, first")
    parser.add_argument("--window", type=int, default=64, help="keys: messages in flight")
    parser.add_argument("--target-ratio", type=float, default=1.10)
    parser.add_argument("--listeners", type=int, default=10_000, help="presence: over 2 instances")
    parser.add_argument("--limits", default="1000,10000", help="presence: page sizes")
    parser.add_argument("--requests", type=int, default=20, help="presence: of each kind")
    parser.add_argument("--pace", type=float, default=0.1, help="presence: s between requests")
    parser.add_argument("--settle", type=float, default=2.0, help="presence: s after connecting")
    parser.add_argument("--target-ms", type=float, default=100.0)
    parser.add_argument("--connect-concurrency", type=int, default=100)
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--quiet", type=float, default=30.0, help="s to wait for a quiet machine")
    args = parser.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    args.backplanes = [b for b in args.backplanes.split(",") if b]
    args.limits = [int(x) for x in args.limits.split(",") if x]
    if not set(args.parts) <= {"keys", "presence"}:
        parser.error("--parts takes keys, presence")
    if not set(args.backplanes) <= {"memory", "redis"}:
        parser.error("--backplanes takes memory, redis")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    print(machine.environment(["aiohttp", "python-socketio", "python-engineio", "redis"]))
    print(f"bow_gateway: {args.gateway or machine.git_state()}")
    machine.raise_open_files_limit()
    os.sched_setaffinity(0, {args.client_cpu})
    variant = source_variant(args.gateway, 2, tempfile.mkdtemp(prefix="feedback-"))
    met = True
    for part in args.parts:
        if args.quiet > 0:
            machine.wait_for_quiet(args.quiet)
        met = (keys_part if part == "keys" else presence_part)(args, variant) and met
    print(f"\nload average now: {machine.load_average()}; every target met: {met}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
