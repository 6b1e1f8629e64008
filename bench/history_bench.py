"""Topic histories through Redis with an AOF (issue 15): retained messages accepted and delivered
end to end, a replay to one connection, and what a retained message and a topic cost in Redis.

Run:  .venv/bin/python bench/history_bench.py                     # the three parts, ~1.5 min
      .venv/bin/python bench/history_bench.py --rate 35000        # offered load paced at 35,000/s
      .venv/bin/python bench/history_bench.py --parts retain --duration 5 --quiet 0   # a quick look
      .venv/bin/python bench/history_bench.py --py-spy /tmp/gw.svg   # + py-spy of the gateway

A plain script, not a test. A private redis-server persists as a production one would
(``--appendonly yes --appendfsync everysec``, its AOF in a temporary directory on the machine's
disk); it and this process, the load generator, are pinned to CPU 1, and each part starts a fresh
gateway (``_gateway.py --envelope --history '[{"filter": "chat/#", ...}]'``: JWT outbound v1.3,
claims middleware, an inbound that takes envelopes or JSON lists of them, the Redis backplane)
pinned to CPU 0, with a namespace of its own on a flushed Redis. Messages are envelopes
``{"name": "chat/...", "payload": "<100 characters>", "audience": [{"room": 1}]}``; a
``[[history]]`` rule keeps ``chat/#``, so each one is one run of the backplane's RETAIN script.

1. **retain**: one lean Socket.IO protocol-2 websocket client (``fanout_bench.LeanClient``,
   ``&proto=2``, criteria ``{"room": 1}``) subscribes; ``--posters`` aiohttp keep-alive
   connections POST batches of ``--batch`` (100) messages to ``chat/room1`` back to back (or
   paced at ``--rate`` messages/s in all). After ``--warmup`` s, ``--duration`` s are measured:
   messages accepted (answered ``204``) per second and messages delivered to the subscriber per
   second, end to end, with the latency of each delivery (each payload starts with the
   ``time.monotonic_ns()`` of its POST). Then the posters stop and the subscriber must receive
   everything accepted: every sequence from 1 to the last exactly once (``meta.sequence``), or
   the exit status is 1. CPU per core and per process (``/proc``), Redis's own figures for the
   window (``INFO commandstats``: calls and µs per call of ``EVALSHA`` and the others;
   ``INFO persistence``: AOF rewrites, delayed fsyncs) and the gateway's longest event-loop stall
   are printed.
2. **replay**: ``--fill`` (200,000) messages are POSTed to ``chat/replay`` (batches of 1,000),
   nobody connected; then one protocol-2 client connects and sends ``replay {"topic":
   "chat/replay", "start": 0}``, and again from the sequence after the last it got while the topic
   has more (one replay gives at most 100,000: ``topic_replay.MAX_COUNT``), timing each from the
   emit to its ack ``{"count": n}``; every sequence must come once, in order, with
   ``replayed: true``. Gateway CPU per replayed message (``CLOCK_PROCESS_CPUTIME_ID`` through
   ``_gateway.py``'s ``cpu``) and Redis's.
3. **memory**: ``INFO memory`` ``used_memory`` before and after ``--retained`` (100,000) messages
   of 100-byte payloads in one topic, per message; ``MEMORY USAGE ... SAMPLES 0`` of the topic's
   stream ``{ns}:topic:chat/memory`` per entry, and of the gateway's event stream ``{ns}:events``
   (every event, kept or not, trimmed to about ``backplane.max_len``, 100,000 by default) per
   entry, stated apart; then ``--topics`` (10,000) topics of one message each, and the same
   topics once their streams are trimmed to nothing (``XTRIM MAXLEN 0``, as ``max_age`` leaves
   a topic nobody wrote to lately): the cost of a topic, i.e. its key ``{ns}:topic:<topic>`` and
   its field in ``{ns}:sequences``.

The exit status is 1 when something was lost or duplicated, or a target of the issue was missed:
at least 35,000 messages/s accepted and delivered (batches of 100), at least 70,000 messages/s
replayed to one connection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as common
import _gateway as gateway
import aiohttp
import fanout_bench as fanout
import redis_bench
from _redis import RedisServer
from bow_gateway.outbounds.jwt import mint
from redis.asyncio import Redis

TARGET_RETAIN = 35_000  # messages/s accepted and delivered end to end (batches of 100)
TARGET_REPLAY = 70_000  # messages/s replayed to one connection
PAYLOAD = 100  # characters (bytes: ASCII) per payload
AUDIENCE = [{"room": 1}]
NOBODY = [{"room": 2}]  # the memory part: no delivery
LIVE, REPLAYED, MEMORY = "chat/room1", "chat/replay", "chat/memory"
SEQUENCE = re.compile(rb'"sequence":(\d+)')
monotonic_ns = time.monotonic_ns


def history_rules(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [{"filter": "chat/#", "max_count": args.max_count, "max_age": 86_400}]


def envelope(name: str, t: int, audience: list[dict[str, Any]] = AUDIENCE) -> bytes:
    """One message: its payload is ``t`` (19 digits) padded to 100 characters."""
    payload = f"{t:019d}".ljust(PAYLOAD, "x")
    return json.dumps(
        {"name": name, "payload": payload, "audience": audience}, separators=(",", ":")
    ).encode()


def batch_body(name: str, count: int, audience: list[dict[str, Any]] = AUDIENCE) -> bytes:
    """A JSON list of ``count`` messages, all stamped now."""
    one = envelope(name, monotonic_ns(), audience)
    return b"[" + b",".join([one] * count) + b"]"


# -- the subscriber ----------------------------------------------------------------------------


class Subscriber(fanout.LeanClient):
    """A protocol-2 lean client that counts the events of one topic by ``meta.sequence``.

    Each live event's latency is now minus the ``monotonic_ns`` its payload starts with.
    ``replay()`` sends a ``replay`` and resolves with the ack's result.
    """

    def __init__(self, host: str, token: str, topic: str) -> None:
        super().__init__(fanout.Books(), host, token, proto=2, options={})
        self.topic = topic
        self.prefix = b'42["' + topic.encode() + b'","'
        self.offset = len(self.prefix)
        self.seen = bytearray(1 << 16)  # how often each sequence came (saturates at 255)
        self.count = 0  # events of the topic
        self.replayed = 0  # of which replayed
        self.last_replayed = 0  # the sequence of the last replayed event
        self.disorder = 0  # replayed events whose sequence is not the last one's + 1
        self.latencies = array("q")
        self.record = False  # latencies only within the measured window
        self.others: list[bytes] = []  # other events (an alert...)
        self._acks: dict[int, asyncio.Future[Any]] = {}
        self._next_ack = 1

    def _packet(self, opcode: int, payload: bytes) -> fanout.Message | None:
        if opcode == 0x1 and payload.startswith(b"43") and self.ready.done():
            digits = payload[2 : payload.index(b"[")]
            waiter = self._acks.pop(int(digits), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(json.loads(payload[2 + len(digits) :])[0])
            return None
        return super()._packet(opcode, payload)

    def _event(self, payload: bytes) -> fanout.Message | None:
        if not payload.startswith(self.prefix):
            if not payload.startswith((b'42["__position"', b'42["__gap"')):
                self.others.append(payload[:300])
            return None
        tail = payload.rfind(b'"sequence":')
        match = SEQUENCE.match(payload, tail) if tail >= 0 else None
        if match is None:
            self.others.append(payload[:300])
            return None
        sequence = int(match[1])
        seen = self.seen
        if sequence >= len(seen):
            seen.extend(bytes(max(sequence + 1, 2 * len(seen)) - len(seen)))
        if seen[sequence] < 255:
            seen[sequence] += 1
        self.count += 1
        if payload.endswith(b'"replayed":true}]'):
            self.replayed += 1
            if sequence != self.last_replayed + 1:
                self.disorder += 1
            self.last_replayed = sequence
        elif self.record:
            start = self.offset
            self.latencies.append(monotonic_ns() - int(payload[start : start + 19]))
        return None

    def check(self, last: int) -> tuple[int, int, int]:
        """(sequences 1..last missing, received more than once, received beyond ``last``)."""
        seen = memoryview(self.seen)
        upto = bytes(seen[1 : last + 1]).ljust(last, b"\0")
        missing = upto.count(0)
        duplicated = last - missing - upto.count(1)
        rest = bytes(seen[last + 1 :])
        beyond = len(rest) - rest.count(0)
        return missing, duplicated, beyond

    def replay(self, request: dict[str, Any]) -> asyncio.Future[Any]:
        ack_id, self._next_ack = self._next_ack, self._next_ack + 1
        waiter = self._acks[ack_id] = asyncio.get_running_loop().create_future()
        self._send(b"42%d" % ack_id + json.dumps(["replay", request]).encode())
        return waiter


async def subscribe(port: int, topic: str, listener: str, room: int = 1) -> Subscriber:
    token = mint(listener, gateway.SECRET, criteria={"room": room})
    client = Subscriber(f"127.0.0.1:{port}", token, topic)
    loop = asyncio.get_running_loop()
    await loop.create_connection(lambda: client, "127.0.0.1", port)
    await asyncio.wait_for(client.ready, 30)
    return client


# -- the posters -------------------------------------------------------------------------------


@dataclass
class Posting:
    """What the posters did: messages accepted (``204``), refusals by status."""

    accepted: int = 0
    posts: int = 0
    refused: dict[int, int] = field(default_factory=dict)
    post_ns: array[int] = field(default_factory=lambda: array("q"))  # round trips of the window
    record: bool = False


async def post_loop(
    session: aiohttp.ClientSession,
    url: str,
    body: Any,
    count: int,
    posting: Posting,
    stop: asyncio.Event,
    pace: list[float] | None = None,
    total: int | None = None,
) -> None:
    """POST ``body()`` (``count`` messages) until ``stop`` (or ``total`` messages in all);
    ``pace``: [the next batch's due time (monotonic s), seconds per batch], shared."""
    while not stop.is_set():
        if total is not None:
            if posting.posts * count >= total:
                return
            posting.posts += 1  # reserve this batch
        if pace is not None:
            due = pace[0]
            pace[0] = max(due, time.monotonic() - pace[1]) + pace[1]  # no catching up in bursts
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        started = monotonic_ns()
        async with session.post(url, data=body()) as response:
            await response.read()
            status = response.status
        if total is None:
            posting.posts += 1
        if status == 204:
            posting.accepted += count
            if posting.record:
                posting.post_ns.append(monotonic_ns() - started)
        else:
            posting.refused[status] = posting.refused.get(status, 0) + 1
            if status >= 500:
                await asyncio.sleep(0.05)


def session_for(posters: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=posters, force_close=False)
    authorization = aiohttp.encode_basic_auth(gateway.USER, gateway.PASSWORD)
    headers = {"Authorization": authorization, "Content-Type": "application/json"}
    return aiohttp.ClientSession(connector=connector, headers=headers)


async def fill(
    url: str, name: str, total: int, batch: int, posters: int, audience: list[dict[str, Any]]
) -> tuple[Posting, float]:
    """POST ``total`` messages to ``name`` in batches, ``posters`` at a time; the time it took."""
    posting, stop = Posting(), asyncio.Event()
    started = time.monotonic()
    async with session_for(posters) as session:
        await asyncio.gather(
            *(
                post_loop(
                    session,
                    url,
                    lambda: batch_body(name, batch, audience),
                    batch,
                    posting,
                    stop,
                    total=total,
                )
                for _ in range(posters)
            )
        )
    return posting, time.monotonic() - started


async def caught_up(url: str, probe: Subscriber, limit: float = 120.0) -> float:
    """POST one message to ``probe`` alone and wait for it: the gateway's consumer, which reads
    the event stream in order, has then read everything published before. The time it took."""
    started = time.monotonic()
    count = probe.count
    async with session_for(1) as session:
        body = b"[" + envelope(probe.topic, monotonic_ns(), [{"room": 3}]) + b"]"
        async with session.post(url, data=body) as response:
            await response.read()
    while probe.count == count and time.monotonic() - started < limit and not probe.lost:
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def fill_topics(url: str, topics: int, batch: int) -> Posting:
    """One message to each of ``topics`` topics ``chat/t/<k>``, ``batch`` per POST."""
    posting = Posting()
    async with session_for(4) as session:
        for first in range(0, topics, batch):
            items = [
                envelope(f"chat/t/{k}", monotonic_ns(), NOBODY)
                for k in range(first, min(topics, first + batch))
            ]
            async with session.post(url, data=b"[" + b",".join(items) + b"]") as response:
                await response.read()
                posting.posts += 1
                if response.status == 204:
                    posting.accepted += len(items)
                else:
                    posting.refused[response.status] = posting.refused.get(response.status, 0) + 1
    return posting


# -- Redis's own figures -----------------------------------------------------------------------


async def commandstats(client: Redis) -> dict[str, tuple[int, int]]:
    """``INFO commandstats``: command -> (calls, µs)."""
    info = await client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in info.items()
        if isinstance(v, dict)
    }


def commandstats_delta(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> list[tuple[str, int, int]]:
    rows = []
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls > c0:
            rows.append((name, calls - c0, usec - u0))
    return sorted(rows, key=lambda row: -row[2])


async def memory_usage(client: Redis, key: str) -> int:
    return int(await client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0") or 0)


async def used_memory(client: Redis) -> int:
    await asyncio.sleep(0.5)  # let the AOF buffer and the clients' buffers drain
    return int((await client.info("memory"))["used_memory"])


# -- the parts ---------------------------------------------------------------------------------


@dataclass
class Part:
    """A gateway of its own for one part, on a flushed Redis."""

    gateways: redis_bench.Gateways
    port: int
    pid: int
    namespace: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{gateway.PATH}"

    async def command(self, text: str) -> dict[str, Any]:
        return (await self.gateways.command(text))[0]


def start_part(args: argparse.Namespace, redis: RedisServer, name: str) -> Part:
    redis.flush()
    if args.quiet > 0:
        common.wait_for_quiet(args.quiet)
    namespace = f"hist-{name}"
    command = [sys.executable, str(redis_bench.HERE / "_gateway.py"), "--namespace", namespace]
    command += ["--redis", redis.url, "--envelope", "--history", json.dumps(history_rules(args))]
    env = dict(os.environ)
    paths = [p for p in (args.pythonpath, args.source) if p]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=args.source or None
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.wait(5)
        raise SystemExit(f"the gateway did not start (exit status {process.returncode})")
    started = json.loads(line)
    port, pid = started["port"], started["pid"]
    if args.source and not started.get("bow_gateway", "").startswith(args.source):
        process.kill()
        raise SystemExit(f"the gateway imported {started.get('bow_gateway')}, not --gateway's")
    url = f"http://127.0.0.1:{port}"
    gateways = redis_bench.Gateways(
        description=f"_gateway.py pid {pid}",
        processes=[process],
        pids=[pid],
        socket_urls=[url],
        post_urls=[url + gateway.PATH],
        version=gateway.OUTBOUND_VERSION,
        secret=gateway.SECRET,
        user=gateway.USER,
        password=gateway.PASSWORD,
        controllable=True,
    )
    fanout.pin_gateway(pid, args.server_cpu)
    print(f"\n== {name}: _gateway.py pid {pid} on port {port}, pinned to CPU {args.server_cpu}")
    print(f"   namespace {namespace!r}, history {json.dumps(history_rules(args))}", flush=True)
    return Part(gateways, port, pid, namespace)


def parser_of(args: argparse.Namespace) -> str:
    """Whether redis-py finds hiredis where the gateway runs."""
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    code = "from redis.utils import HIREDIS_AVAILABLE as h; print('hiredis' if h else 'Python')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return out.stdout.strip() or out.stderr.strip()[-200:]


def redis_latency(port: int, seconds: float) -> subprocess.Popen[str] | None:
    """``redis-cli --latency --raw -i seconds``: one line, min max avg (ms) and samples."""
    if shutil.which("redis-cli") is None:
        return None
    command = [
        "redis-cli",
        "-p",
        str(port),
        "--latency",
        "--raw",
        "-i",
        str(max(1, round(seconds))),
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def latency_text(process: subprocess.Popen[str] | None) -> str:
    if process is None:
        return "redis-cli is not on PATH"
    try:
        out, _ = process.communicate(timeout=30)
        low, high, mean, samples = out.split()[:4]
    except (subprocess.TimeoutExpired, ValueError):
        process.kill()
        return "no answer"
    return f"min {low} ms, avg {mean} ms, max {high} ms over {int(samples):,} PINGs"


def pct(seconds: float, wall: float) -> str:
    return f"{100 * seconds / wall:.0f}%" if wall > 0 else "-"


def py_spy(pid: int, seconds: float | None, output: str) -> subprocess.Popen[bytes] | None:
    """``py-spy record`` of ``pid`` for ``seconds`` (None: until SIGINT) into ``output``."""
    binary = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(binary):
        print("  (py-spy is not installed: `.venv/bin/pip install py-spy`; no profile)")
        return None
    fmt = "speedscope" if output.endswith(".json") else "flamegraph"
    if output.endswith(".txt"):
        fmt = "raw"
    command = [binary, "record", "-p", str(pid), "-o", output, "-f", fmt, "-r", "250"]
    command += ["--nonblocking"] + ([] if seconds is None else ["-d", str(max(1, round(seconds)))])
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def retain_part(args: argparse.Namespace, redis: RedisServer, client: Redis) -> bool:
    part = start_part(args, redis, "retain")
    machine = redis_bench.Machine([part.pid], redis.pid, [])
    ok = True
    try:
        subscriber = await subscribe(part.port, LIVE, "subscriber")
        posting, stop = Posting(), asyncio.Event()
        pace = None
        if args.rate > 0:
            pace = [time.monotonic(), args.batch / args.rate]
        session = session_for(args.posters)
        tasks = [
            asyncio.create_task(
                post_loop(
                    session,
                    part.url,
                    lambda: batch_body(LIVE, args.batch),
                    args.batch,
                    posting,
                    stop,
                    pace,
                )
            )
            for _ in range(args.posters)
        ]
        offered = f"paced at {args.rate:,.0f} messages/s" if args.rate > 0 else "back to back"
        print(
            f"  {args.posters} posters, batches of {args.batch} messages to {LIVE!r} ({offered});"
            f" 1 protocol-2 subscriber; warm-up {args.warmup:g} s, then {args.duration:g} s",
            flush=True,
        )
        await asyncio.sleep(args.warmup)
        await part.command("stall")
        stats0, persistence0 = await commandstats(client), await client.info("persistence")
        cores0, before = fanout.cpu_busy(), machine.snapshot()
        accepted0, delivered0 = posting.accepted, subscriber.count
        subscriber.record = posting.record = True
        started = time.monotonic()
        spy = py_spy(part.pid, args.duration, args.py_spy) if args.py_spy else None
        latency = redis_latency(redis.port, args.duration)
        await asyncio.sleep(args.duration)
        wall = time.monotonic() - started
        accepted, delivered = posting.accepted - accepted0, subscriber.count - delivered0
        subscriber.record = posting.record = False
        after, cores = machine.snapshot(), fanout.cpu_delta(cores0, fanout.cpu_busy())
        stats1, persistence1 = await commandstats(client), await client.info("persistence")
        stall = (await part.command("stall"))["stall"]["longest"]
        backlog = posting.accepted - subscriber.count
        stop.set()
        await asyncio.gather(*tasks)
        await session.close()
        stopped = time.monotonic()
        total = posting.accepted
        deadline = stopped + args.drain
        while subscriber.count < total and time.monotonic() < deadline and not subscriber.lost:
            await asyncio.sleep(0.05)
        drained = time.monotonic() - stopped
        await asyncio.sleep(0.3)  # anything more (a duplicate) would come now
        if spy is not None:
            _, errors = spy.communicate()
            if spy.returncode:
                print(f"  py-spy failed: {errors.decode()[-500:]}")
            else:
                print(f"  py-spy profile of the gateway over the window: {args.py_spy}")
        cpu = redis_bench.Machine.delta(before, after)
        median, p99 = fanout_percentiles(subscriber.latencies)
        post_p50, _ = fanout_percentiles(posting.post_ns)
        accepted_rate, delivered_rate = accepted / wall, delivered / wall
        rows = [
            [
                f"{wall:.2f}",
                f"{accepted:,}",
                f"{accepted_rate:,.0f}",
                f"{delivered:,}",
                f"{delivered_rate:,.0f}",
                f"{backlog:,}",
                common.human_ns(median),
                common.human_ns(p99),
                common.human_ns(post_p50),
                pct(cpu["gateways"][0], wall),
                f"{cpu['gateways'][0] * 1e6 / max(1, delivered):.1f}",
                pct(cpu["redis"], wall),
                pct(cpu["loadgen"], wall),
                pct(cpu["other"], wall),
                f"{pct(cores[0][0], wall)} / {pct(cores[1][0], wall)}",
                f"{stall * 1e3:.1f} ms",
            ]
        ]
        headers = [
            "wall s",
            "accepted",
            "accepted/s",
            "delivered",
            "delivered/s",
            "backlog at end",
            "p50",
            "p99",
            "POST p50",
            "gateway CPU",
            "gw µs/message",
            "redis CPU",
            "loadgen CPU",
            "other CPU",
            "CPU 0 / CPU 1 busy",
            "longest stall",
        ]
        print("  Latency: POST start to the subscriber's data_received, per delivery.")
        print(common.table(headers, rows))
        print("  Redis over the window (INFO commandstats): command, calls, µs per call, CPU share")
        stat_rows = [
            [name, f"{calls:,}", f"{usec / calls:.2f}", pct(usec / 1e6, wall)]
            for name, calls, usec in commandstats_delta(stats0, stats1)[:8]
        ]
        print(common.table(["command", "calls", "µs/call", "of wall"], stat_rows))
        rewrites = int(persistence1["aof_rewrites"]) - int(persistence0["aof_rewrites"])
        delayed = int(persistence1["aof_delayed_fsync"]) - int(persistence0["aof_delayed_fsync"])
        print(f"  redis-cli --latency over the window (PING round trips): {latency_text(latency)}")
        print(
            f"  AOF: {rewrites} rewrite(s) during the window, {delayed} delayed fsync(s); "
            f"AOF now {int(persistence1.get('aof_current_size', 0)) / 2**20:,.0f} MiB"
        )
        missing, duplicated, beyond = subscriber.check(total)
        lost = subscriber.lost or missing or duplicated or beyond
        refused = ", ".join(f"{n} x {status}" for status, n in sorted(posting.refused.items()))
        print(
            f"  after the posters stopped: {total:,} accepted in all, {subscriber.count:,} "
            f"received {drained:.2f} s later; sequences 1..{total:,}: {missing:,} missing, "
            f"{duplicated:,} more than once, {beyond:,} beyond; refused POSTs: {refused or 'none'}"
            + (f"; other events: {subscriber.others[:3]}" if subscriber.others else "")
        )
        if lost:
            print("  FAILED: the subscriber did not receive every accepted message exactly once")
            ok = False
        for what, rate in (("accepted", accepted_rate), ("delivered", delivered_rate)):
            verdict = "met" if rate >= TARGET_RETAIN else "MISSED"
            print(f"  target: >= {TARGET_RETAIN:,} messages/s {what}: {rate:,.0f}/s, {verdict}")
            ok = ok and rate >= TARGET_RETAIN
        subscriber.close()
    finally:
        part.gateways.stop()
    return ok


def replay_file(output: str) -> str:
    """``/tmp/gw.svg`` -> ``/tmp/gw-replay.svg``."""
    stem, dot, extension = output.rpartition(".")
    return f"{stem}-replay.{extension}" if dot and "/" not in extension else output + "-replay"


def fanout_percentiles(values: Sequence[int]) -> tuple[float, float]:
    return common.percentile(values, 0.5), common.percentile(values, 0.99)


async def replay_part(args: argparse.Namespace, redis: RedisServer, client: Redis) -> bool:
    part = start_part(args, redis, "replay")
    ok = True
    try:
        probe = await subscribe(part.port, "chat/probe", "probe", room=3)
        posting, took = await fill(part.url, REPLAYED, args.fill, 1000, args.posters, AUDIENCE)
        key = f"{{{part.namespace}}}:topic:{REPLAYED}"
        length = int(await client.xlen(key))
        print(
            f"  filled {REPLAYED!r} with {posting.accepted:,} messages in {took:.1f} s "
            f"({posting.accepted / took:,.0f}/s, batches of 1,000, nobody connected); "
            f"its stream holds {length:,} entries ({await memory_usage(client, key) / 2**20:.1f} "
            "MiB)",
            flush=True,
        )
        lag = await caught_up(part.url, probe)  # else the replayer would get the fill live
        print(f"  the gateway's consumer had read the fill {lag:.1f} s later", flush=True)
        subscriber = await subscribe(part.port, REPLAYED, "replayer")
        await asyncio.sleep(0.5)
        rows = []
        start, rates = 0, []
        spy = py_spy(part.pid, None, replay_file(args.py_spy)) if args.py_spy else None
        total_count, total_wall, total_gw, total_redis = 0, 0.0, 0.0, 0.0
        while True:
            await part.command("stall")
            gw0 = (await part.command("cpu"))["cpu_ns"]
            redis0, count0 = common.cpu_seconds(redis.pid), subscriber.replayed
            live0 = subscriber.count - subscriber.replayed
            started = monotonic_ns()
            result = await asyncio.wait_for(
                subscriber.replay({"topic": REPLAYED, "start": start}), 120
            )
            wall = (monotonic_ns() - started) / 1e9
            gw = ((await part.command("cpu"))["cpu_ns"] - gw0) / 1e9
            redis_cpu = common.cpu_seconds(redis.pid) - redis0
            stall = (await part.command("stall"))["stall"]["longest"]
            got = subscriber.replayed - count0
            live = subscriber.count - subscriber.replayed - live0
            count = result.get("count") if isinstance(result, dict) else None
            if count != got or live:
                print(
                    f"  FAILED: the ack says {result}, the client received {got:,} replayed "
                    f"events and {live:,} live ones"
                )
                ok = False
            rates.append(got / wall)
            rows.append(
                [
                    str(start),
                    f"{got:,}",
                    f"{wall:.2f}",
                    f"{got / wall:,.0f}",
                    f"{gw * 1e6 / max(1, got):.1f}",
                    pct(gw, wall),
                    pct(redis_cpu, wall),
                    f"{stall * 1e3:.1f} ms",
                ]
            )
            total_count, total_wall = total_count + got, total_wall + wall
            total_gw, total_redis = total_gw + gw, total_redis + redis_cpu
            if not got or subscriber.last_replayed >= length:
                break
            start = subscriber.last_replayed + 1
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
            print(f"  py-spy profile of the gateway over the replays: {replay_file(args.py_spy)}")
        headers = [
            "start",
            "replayed",
            "wall s",
            "messages/s",
            "gw µs/message",
            "gateway CPU",
            "redis CPU",
            "longest stall",
        ]
        print("  Each replay timed from the emit to its ack {count}.")
        print(common.table(headers, rows))
        missing, duplicated, beyond = subscriber.check(length)
        per = max(1, total_count) / 1e6
        print(
            f"  in all: {total_count:,} replayed in {total_wall:.2f} s = "
            f"{total_count / total_wall:,.0f} messages/s; gateway {total_gw / per:.1f} "
            f"µs/message, Redis {total_redis / per:.1f} µs/message; "
            f"sequences 1..{length:,}: {missing:,} missing, {duplicated:,} more than once, "
            f"{subscriber.disorder:,} out of order, {subscriber.replayed:,} marked replayed"
        )
        if missing or duplicated or beyond or subscriber.disorder or subscriber.lost:
            print("  FAILED: the replays did not give every message once, in order")
            ok = False
        rate = total_count / total_wall if total_wall else 0.0
        verdict = "met" if rate >= TARGET_REPLAY else "MISSED"
        print(f"  target: >= {TARGET_REPLAY:,} messages/s replayed: {rate:,.0f}/s, {verdict}")
        ok = ok and rate >= TARGET_REPLAY
        subscriber.close()
    finally:
        part.gateways.stop()
    return ok


async def memory_part(args: argparse.Namespace, redis: RedisServer, client: Redis) -> bool:
    part = start_part(args, redis, "memory")
    ns = part.namespace
    events, sequences = f"{{{ns}}}:events", f"{{{ns}}}:sequences"
    topic_key = f"{{{ns}}}:topic:{MEMORY}"
    try:
        base = await used_memory(client)
        events0, sequences0 = (
            await memory_usage(client, events),
            await memory_usage(client, sequences),
        )
        xlen0 = int(await client.xlen(events)) if events0 else 0
        posting, _ = await fill(part.url, MEMORY, args.retained, 1000, args.posters, NOBODY)
        n = posting.accepted
        retained = await used_memory(client)
        events1, topic1 = await memory_usage(client, events), await memory_usage(client, topic_key)
        xlen1 = int(await client.xlen(events))
        per_entry_main = (events1 - events0) / max(1, xlen1 - xlen0)
        sample = await client.xrange(topic_key, "-", "+", count=1)
        entry = sample[0][1] if sample else {}
        data_bytes = len(entry.get(b"d", b""))
        position_bytes = len(entry.get(b"p", b""))
        print(
            f"  {n:,} messages of {PAYLOAD}-byte payloads in {MEMORY!r} (audience nobody "
            f"connected); each stored as d = {data_bytes} bytes (the event's JSON) and p = "
            f"{position_bytes} bytes (its position in the event stream)"
        )
        rows = [
            [
                "used_memory, after - before",
                f"{(retained - base) / 2**20:,.1f} MiB",
                f"{(retained - base) / n:,.0f}",
                "both copies: topic stream + event stream + the rest",
            ],
            [
                f"MEMORY USAGE {topic_key}",
                f"{topic1 / 2**20:,.1f} MiB",
                f"{topic1 / n:,.0f}",
                "the topic's history: what a retained message costs",
            ],
            [
                f"MEMORY USAGE {events} (+{xlen1 - xlen0:,} entries)",
                f"{(events1 - events0) / 2**20:,.1f} MiB",
                f"{per_entry_main:,.0f}",
                f"every event, kept or not; at most ~backplane.max_len entries ({xlen1:,} now)",
            ],
        ]
        print(common.table(["measure", "total", "bytes per message", "what"], rows))

        # Topics of one message, then emptied.
        before = await used_memory(client)
        events2 = await memory_usage(client, events)
        sequences2 = await memory_usage(client, sequences)
        topics = await fill_topics(part.url, args.topics, 1000)
        t = topics.accepted
        after = await used_memory(client)
        events3, sequences3 = (
            await memory_usage(client, events),
            await memory_usage(client, sequences),
        )
        one_key = await memory_usage(client, f"{{{ns}}}:topic:chat/t/0")
        pipeline = client.pipeline(transaction=False)
        for k in range(args.topics):
            pipeline.xtrim(f"{{{ns}}}:topic:chat/t/{k}", maxlen=0)
        await pipeline.execute()
        emptied = await used_memory(client)
        empty_key = await memory_usage(client, f"{{{ns}}}:topic:chat/t/0")
        main_share = events3 - events2
        hash_share = sequences3 - sequences2
        print(
            f"  {t:,} topics 'chat/t/<k>' of one message each, then each topic's stream trimmed to "
            f"nothing (XTRIM MAXLEN 0, as max_age leaves an idle topic); {ns!r}:sequences held "
            f"{sequences0:,} bytes before"
        )
        rows = [
            [
                "used_memory, after - before, less the event stream's change",
                f"{(after - before - main_share) / 2**20:,.1f} MiB",
                f"{(after - before - main_share) / t:,.0f}",
                "a topic of one message: its stream key, the entry, its sequences field",
            ],
            [
                "  of which {ns}:sequences (MEMORY USAGE)",
                f"{hash_share / 2**20:,.2f} MiB",
                f"{hash_share / t:,.0f}",
                "the topic's field in the hash of last sequences",
            ],
            [
                "the same, once emptied",
                f"{(emptied - before - main_share) / 2**20:,.1f} MiB",
                f"{(emptied - before - main_share) / t:,.0f}",
                "an empty topic: its stream key and its sequences field",
            ],
            [
                "the event stream's change (MEMORY USAGE)",
                f"{main_share / 2**20:,.1f} MiB",
                f"{main_share / t:,.0f}",
                "~0 once it is at max_len: it trims as much as it takes",
            ],
            [
                "MEMORY USAGE of one topic key",
                "-",
                f"{one_key:,} / {empty_key:,}",
                "with its one message / emptied",
            ],
        ]
        print(common.table(["measure", "total", "bytes per topic", "what"], rows))
    finally:
        part.gateways.stop()
    return True


async def bench(args: argparse.Namespace, redis: RedisServer) -> bool:
    client = Redis.from_url(redis.url)
    ok = True
    try:
        if "retain" in args.parts:
            ok = await retain_part(args, redis, client) and ok
        if "replay" in args.parts:
            ok = await replay_part(args, redis, client) and ok
        if "memory" in args.parts:
            ok = await memory_part(args, redis, client) and ok
    finally:
        await client.aclose()
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--parts", default="retain,replay,memory", help="which parts, in order")
    parser.add_argument("--duration", type=float, default=10.0, help="s measured (retain)")
    parser.add_argument("--warmup", type=float, default=3.0, help="s before measuring (retain)")
    parser.add_argument("--posters", type=int, default=4, help="concurrent POSTing connections")
    parser.add_argument("--batch", type=int, default=100, help="messages per POST (retain)")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="messages/s offered in all (0: back to back)"
    )
    parser.add_argument("--drain", type=float, default=60.0, help="s to wait for the backlog")
    parser.add_argument("--fill", type=int, default=200_000, help="messages to replay")
    parser.add_argument("--retained", type=int, default=100_000, help="messages (memory)")
    parser.add_argument("--topics", type=int, default=10_000, help="topics (memory)")
    parser.add_argument(
        "--max-count", type=int, default=1_000_000, help="the [[history]] rule's max_count"
    )
    parser.add_argument("--quiet", type=float, default=30.0, help="s to wait for a quiet machine")
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument(
        "--py-spy",
        metavar="FILE",
        help="py-spy record the gateway over the retain window (.svg flame graph, .json "
        "speedscope, .txt collapsed stacks), and over the replays (FILE with -replay)",
    )
    parser.add_argument(
        "--gateway",
        help="run another checkout's gateway (e.g. /tmp/bow-HEAD from `git archive`) rather "
        "than this working tree's",
    )
    parser.add_argument(
        "--pythonpath", help="a directory put first on the gateway's PYTHONPATH (e.g. hiredis)"
    )
    args = parser.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = set(args.parts) - {"retain", "replay", "memory"}
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}")
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("two CPUs are needed: one for the gateway, one for the load generator")
    redis_bench.raise_open_files_limit()
    print(common.environment(["aiohttp", "redis", "orjson"]))
    workdir = tempfile.mkdtemp(prefix="history-bench-")
    args.source = None
    if args.gateway:
        import attack_bench  # here: it imports fanout_bench

        layout = attack_bench.package_layout(Path(args.gateway), Path(workdir) / "gateway")
        args.source = str(layout)
        print(f"bow_gateway: {args.gateway} (--gateway)")
    else:
        print(f"bow_gateway: {redis_bench.git_state()}")
    if args.pythonpath:
        print(
            f"the gateway's PYTHONPATH starts with {args.pythonpath}: {os.listdir(args.pythonpath)}"
        )
    print(f"the gateway's redis-py parser: {parser_of(args)}")
    os.sched_setaffinity(0, {args.client_cpu})
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with RedisServer(cpu=args.client_cpu, aof=True) as redis:
        print(
            f"redis-server {redis.version()} (private: pid {redis.pid}, port {redis.port}, "
            f"--appendonly yes --appendfsync everysec, AOF in {redis.dir}) and the load generator "
            f"(this process, pid {os.getpid()}) on CPU {args.client_cpu}"
        )
        gc.freeze()
        try:
            ok = asyncio.run(bench(args, redis))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nload average now: {common.load_average()}")
    if not ok:
        print("FAILED: see above (a target missed, or messages lost)")
    return 0 if ok else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
