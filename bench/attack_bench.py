"""Attack benchmark: what hostile clients cost an honest listener, and the gateway (issue 11).

Run:  .venv/bin/python bench/attack_bench.py [--attacks frames,binary,binary-token,holders,queries]
      .venv/bin/python bench/attack_bench.py --source /tmp/bow-before   # another checkout

A plain script, not a test; about a minute, once the machine is quiet (``--quiet``: at most 30 s
of waiting). It starts ``bow-gateway serve`` (``python -m bow_gateway serve``: the embedded
default configuration, as in production: JSON log lines on stderr, gc_freeze on, in-process
backplane, ``outbound.timeout`` 5 s), its stdout and stderr in one log file, pinned to CPU 0
with ``taskset``; this process and the attackers pin themselves to CPU 1. ``--source DIR`` runs
the gateway of another checkout (``git archive <commit> | tar -x -C DIR``) instead of the
installed one, through ``PYTHONPATH``.

The honest listener (this process): one python-socketio client over websocket, authenticated with
a JWT as ``HONEST/1``, and a message ``[{"__id": "HONEST/1"}]`` POSTed every ``--interval``
(20 ms) from start to end, each in a task of its own (a stalled gateway does not slow the POSTs
down), carrying its sequence number and ``time.monotonic_ns()`` taken just before its POST; the
listener records when each arrives (CLOCK_MONOTONIC is system-wide). A disconnected listener is
reconnected (and the disconnection counted).

Then a baseline window without attack, and each attack in turn, run by a child process of its own
(this script with ``--attacker``), each followed by a quiet ``--pause``:

- ``frames``: Engine.IO frames of unknown type (``7``, ``8``, ``9``, one byte each) over raw
  websockets (aiohttp) that never authenticate, ``--frame-connections`` at a time, each one
  reopened when the gateway closes it, until ``--frames`` (20,000) were sent or
  ``--frame-seconds`` (10 s) passed;
- ``binary``: for ``--binary-seconds`` (5 s), a raw websocket that connects to the namespace
  (``40``) but never authenticates announces a Socket.IO binary event with 9,999,999,999
  attachments (``459999999999-["authenticate",{"_placeholder":true,"num":0}]``), then sends
  900 KB binary frames as fast as the gateway reads them (reopened and announced again when
  closed);
- ``binary-token``: the same from a socket authenticated with an ordinary end-user token;
- ``holders``: ``--holders`` (2,000) unauthenticated connections, a third of each kind:
  Engine.IO only (open, never a Socket.IO CONNECT), connect then namespace disconnect (``40``
  then ``41``), and a connect refused for a missing ``?v=``; all held (Engine.IO pings answered)
  for ``--hold`` s (8 s, longer than the 5-s authentication timeout) once all are open;
- ``queries``: one POST (with the inbound's Basic Auth) of ``{"name":"x","audience":[{},{},...]}``
  with 349,000 empty queries (1,047,024 bytes, under the 1 MiB body limit).

Both binary attacks stop early if the gateway's RSS grew by ``--rss-cap`` MB (2,048; the
machine's safety, not a target). An attack's window lasts from its start until its child has
exited and the gateway is idle again (under 20% of a CPU for 0.3 s, at most ``--drain`` s), and
every message POSTed in it was answered and, when accepted, delivered (same limit). Per window:

- the honest listener's latency (POST start to receipt, per message): p50, p99, worst; its
  longest gap between two receipts; ``stall`` = the larger of the worst latency and the longest
  gap less one interval; messages lost (answered 204, never received) and refused (not 204);
- the gateway's RSS growth: peak (VmHWM after resetting it through ``/proc/<pid>/clear_refs``,
  and VmRSS sampled every 20 ms) less VmRSS at the start; and what is still held after the pause;
- bytes (and lines, and the longest line) the gateway wrote to its log, and its CPU seconds
  (utime + stime from ``/proc/<pid>/stat``; the honest traffic alone costs what the baseline row
  shows).

Targets (issue 11), per attack: stall under 250 ms, RSS growth under 64 MB, log under 1 MB, no
honest message lost; and no holder still open at the end of its hold (every connection that is not
authenticated within ``outbound.timeout`` is closed). The exit status is 1 when an attack misses
one of them.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as common
import _gateway as gateway
import aiohttp
import socketio
from _redis import free_port
from fanout_bench import pin_gateway
from redis_bench import git_state, raise_open_files_limit

HERE = Path(__file__).resolve().parent
VERSION = "v1"  # the embedded default's outbound version
INBOUND = "/v1/messages"  # and its inbound
EVENT = "probe"
HONEST = "HONEST/1"
ATTACKS = ("frames", "binary", "binary-token", "holders", "queries")
TARGET_STALL_MS, TARGET_RSS_MB, TARGET_LOG_BYTES = 250.0, 64.0, 1 << 20
HUGE_COUNT = 9_999_999_999
BINARY_HEADER = f'45{HUGE_COUNT}-["authenticate",{{"_placeholder":true,"num":0}}]'
HOLDER_KINDS = ("engineio-only", "40-then-41", "refused-no-v")
MB = 1024 * 1024
STILL_OPEN = "still open at the end of the hold"


# -- the gateway --------------------------------------------------------------------------------


@dataclass
class Gateway:
    """``bow-gateway serve`` in a child process, its stdout and stderr in ``log``."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_size(self) -> int:
        return self.log.stat().st_size

    def rss_kib(self) -> int:
        return common.rss_kib(self.pid)["VmRSS"]

    def reset_peak(self) -> bool:
        """Reset VmHWM to the current RSS (Linux 4.0+); False if not allowed."""
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w", encoding="ascii") as clear_refs:
                clear_refs.write("5")
            return True
        except OSError:
            return False

    def peak_kib(self) -> int:
        return common.rss_kib(self.pid)["VmHWM"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def package_layout(source: Path, into: Path) -> Path:
    """A directory for ``PYTHONPATH`` where ``bow_gateway`` is ``source``'s, with its bundled
    plugins as subpackages (as setup.cfg's package_dir installs them), made of symlinks."""
    package = into / "pythonpath" / "bow_gateway"
    package.mkdir(parents=True)
    for entry in (source / "bow_gateway").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry.resolve())
    for plugins in ("inbounds", "outbounds", "middlewares"):
        (package / plugins).symlink_to((source / plugins).resolve())
    return package.parent


def start_gateway(args: argparse.Namespace, workdir: Path) -> Gateway:
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("BOW_")}
    env.update(BOW_JWT_SECRET=gateway.SECRET, BOW_INBOUND_PASSWORD=gateway.PASSWORD)
    if args.source:
        env["PYTHONPATH"] = str(package_layout(Path(args.source), workdir))
    log = workdir / "gateway.log"
    command = [sys.executable, "-m", "bow_gateway", "serve", "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    with open(log, "wb") as out:  # cwd: no bow_gateway there to shadow the one meant
        process = subprocess.Popen(
            command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    return Gateway(process, f"http://127.0.0.1:{port}", log)


async def wait_until_serving(gw: Gateway, http: aiohttp.ClientSession, limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if gw.process.poll() is not None:
            break
        try:
            async with http.get(gw.url + "/health") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    tail = gw.log.read_text(errors="replace")[-3000:]
    raise SystemExit(f"the gateway did not start (exit status {gw.process.poll()}):\n{tail}")


async def wait_until_idle(pid: int, limit: float, busy: float = 0.2, span: float = 0.3) -> float:
    """Wait until ``pid`` used under ``busy`` of a CPU for ``span`` s; the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        before = common.cpu_seconds(pid)
        await asyncio.sleep(span)
        if common.cpu_seconds(pid) - before < busy * span:
            break
    return time.monotonic() - started


# -- the honest listener ------------------------------------------------------------------------


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
            "p50": common.percentile(latencies, 0.5),
            "p99": common.percentile(latencies, 0.99),
            "worst": worst,
            "gap": gap,
            "stall": max(worst, gap - self.interval * 1000),
            "lost": sum(self.status.get(s) == 204 and s not in self.received for s in seqs),
            "refused": sum(self.status.get(s, 0) != 204 for s in seqs),
            "disconnects": sum(started <= t <= ended for t in self.disconnects),
        }


def gateway_token(listener_id: str, criteria: dict[str, Any]) -> str:
    from bow_gateway.outbounds.jwt import mint

    token: str = mint(listener_id, gateway.SECRET, criteria=criteria)
    return token


# -- the attackers (child processes) ------------------------------------------------------------


def ws_url(url: str, version: str | None = VERSION) -> str:
    query = "EIO=4&transport=websocket" + (f"&v={version}" if version else "")
    return url.replace("http://", "ws://", 1) + "/socket.io/?" + query


async def reader(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Read until the gateway closes the websocket, answering Engine.IO pings."""
    async for message in ws:
        if message.type == aiohttp.WSMsgType.TEXT and message.data == "2":
            await ws.send_str("3")


async def attack_frames(spec: dict[str, Any]) -> dict[str, Any]:
    counts: collections.Counter[str] = collections.Counter()
    total: int = spec["frames"]
    deadline = time.monotonic() + spec["seconds"]

    def more() -> bool:
        return counts["frames"] < total and time.monotonic() < deadline

    async def attacker(http: aiohttp.ClientSession) -> None:
        while more():
            try:
                ws = await http.ws_connect(ws_url(spec["url"]), autoping=True)
                await ws.receive(timeout=5)  # Engine.IO OPEN
            except (TimeoutError, aiohttp.ClientError, OSError):
                counts["connect failures"] += 1
                await asyncio.sleep(0.01)
                continue
            counts["connections"] += 1
            reading = asyncio.create_task(reader(ws))
            try:
                while more() and not reading.done() and not ws.closed:
                    await ws.send_str("789"[counts["frames"] % 3])
                    counts["frames"] += 1
                    if counts["frames"] % 20 == 0:
                        await asyncio.sleep(0)  # let the reader see a close
            except (aiohttp.ClientError, OSError):
                counts["send failures"] += 1
            if reading.done() or ws.closed:
                counts["closed by the gateway"] += 1
            reading.cancel()
            await ws.close()

    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(attacker(http) for _ in range(spec["connections"])))
    return {**counts, "seconds": round(time.monotonic() - started, 2)}


async def attack_binary(spec: dict[str, Any]) -> dict[str, Any]:
    counts: collections.Counter[str] = collections.Counter()
    frame = os.urandom(spec["frame_bytes"])
    cap_kib = common.rss_kib(spec["pid"])["VmRSS"] + spec["rss_cap_mb"] * 1024
    deadline = time.monotonic() + spec["seconds"]
    capped = False

    def more() -> bool:
        nonlocal capped
        capped = capped or common.rss_kib(spec["pid"])["VmRSS"] > cap_kib
        return not capped and time.monotonic() < deadline

    async def attacker(http: aiohttp.ClientSession) -> None:
        while more():
            try:
                ws = await http.ws_connect(ws_url(spec["url"]), autoping=True)
                await ws.receive(timeout=5)  # Engine.IO OPEN
                await ws.send_str("40")  # else the binary packet is refused as unexpected
                await ws.receive(timeout=5)  # 40{"sid": ...}
                if spec.get("token"):
                    await ws.send_str(f'421["authenticate",{json.dumps(spec["token"])}]')
                    while not (await ws.receive_str(timeout=5)).startswith("431"):
                        pass
                    counts["authenticated"] += 1
                await ws.send_str(BINARY_HEADER)
            except (TimeoutError, aiohttp.ClientError, OSError, TypeError) as error:
                counts[f"connect failures ({type(error).__name__})"] += 1
                await asyncio.sleep(0.05)
                continue
            counts["connections"] += 1
            reading = asyncio.create_task(reader(ws))
            try:
                while more() and not reading.done() and not ws.closed:
                    await ws.send_bytes(frame)
                    counts["frames"] += 1
                    await asyncio.sleep(0)
            except (aiohttp.ClientError, OSError):
                counts["send failures"] += 1
            if reading.done() or ws.closed:
                counts["closed by the gateway"] += 1
            reading.cancel()
            await ws.close()

    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(attacker(http) for _ in range(spec["connections"])))
    return {
        **counts,
        "MB sent": round(counts["frames"] * len(frame) / MB),
        "stopped at the RSS cap": capped,
        "seconds": round(time.monotonic() - started, 2),
    }


async def attack_holders(spec: dict[str, Any]) -> dict[str, Any]:
    opened: collections.Counter[str] = collections.Counter()
    failed: collections.Counter[str] = collections.Counter()
    closed: collections.Counter[str] = collections.Counter()
    lifetimes: list[float] = []
    semaphore = asyncio.Semaphore(spec["concurrency"])
    settled = asyncio.Event()
    pending = spec["holders"]

    async def hold(http: aiohttp.ClientSession, i: int) -> None:
        nonlocal pending
        kind = HOLDER_KINDS[i % len(HOLDER_KINDS)]
        try:
            async with semaphore:
                try:
                    version = None if kind == "refused-no-v" else VERSION
                    ws = await http.ws_connect(ws_url(spec["url"], version), autoping=True)
                    await ws.receive(timeout=10)  # Engine.IO OPEN
                    if kind != "engineio-only":
                        await ws.send_str("40")
                        await ws.receive(timeout=10)  # 40{"sid"...}, or 44{...} refused
                        if kind == "40-then-41":
                            await ws.send_str("41")
                except (TimeoutError, aiohttp.ClientError, OSError):
                    failed[kind] += 1
                    return
            opened[kind] += 1
        finally:
            pending -= 1
            if not pending:
                settled.set()
        since = time.monotonic()
        await reader(ws)  # until the gateway closes it, or the end of the hold
        closed[kind] += 1
        lifetimes.append(time.monotonic() - since)

    started = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        tasks = [asyncio.create_task(hold(http, i)) for i in range(spec["holders"])]
        await settled.wait()
        open_seconds = time.monotonic() - started
        metrics = await sockets_connected(http, spec["url"])
        await asyncio.sleep(spec["hold"])
        still_open = {kind: opened[kind] - closed[kind] for kind in HOLDER_KINDS}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "opened": dict(opened),
        "failed": dict(failed),
        "seconds to open all": round(open_seconds, 2),
        "bow_sockets_connected once open": metrics,
        "held (s)": spec["hold"],
        STILL_OPEN: still_open,
        "closed by the gateway": sum(closed.values()),
        "longest lifetime of a closed one (s)": round(max(lifetimes, default=0.0), 2),
        "seconds": round(time.monotonic() - started, 2),
    }


async def sockets_connected(http: aiohttp.ClientSession, url: str) -> float | None:
    try:
        async with http.get(url + "/metrics") as response:
            text = await response.text()
    except aiohttp.ClientError:
        return None
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("bow_sockets_connected")
    ]
    return sum(values) if values else None


async def attack_queries(spec: dict[str, Any]) -> dict[str, Any]:
    body = b'{"name":"x","audience":[' + b",".join([b"{}"] * spec["queries"]) + b"]}"
    headers = {
        "Content-Type": "application/json",
        "Authorization": aiohttp.encode_basic_auth(gateway.USER, gateway.PASSWORD),
    }
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        async with http.post(spec["url"] + INBOUND, data=body, headers=headers) as r:
            answer = await r.read()
            status = r.status
    return {
        "body bytes": len(body),
        "status": status,
        "answer bytes": len(answer),
        "seconds": round(time.monotonic() - started, 2),
    }


def attacker_main(kind: str, spec: dict[str, Any]) -> None:
    raise_open_files_limit()
    run = {
        "frames": attack_frames,
        "binary": attack_binary,
        "binary-token": attack_binary,
        "holders": attack_holders,
        "queries": attack_queries,
    }[kind]
    print(json.dumps(asyncio.run(run(spec))), flush=True)


# -- the benchmark ------------------------------------------------------------------------------


def attack_spec(kind: str, args: argparse.Namespace, gw: Gateway) -> dict[str, Any]:
    spec: dict[str, Any] = {"url": gw.url, "pid": gw.pid}
    if kind == "frames":
        spec.update(
            frames=args.frames, seconds=args.frame_seconds, connections=args.frame_connections
        )
    elif kind.startswith("binary"):
        spec.update(
            seconds=args.binary_seconds,
            connections=args.binary_connections,
            frame_bytes=args.frame_bytes,
            rss_cap_mb=args.rss_cap,
        )
        if kind == "binary-token":
            spec["token"] = gateway_token("USER/attacker", {"role": "user"})
    elif kind == "holders":
        spec.update(holders=args.holders, hold=args.hold, concurrency=args.holder_concurrency)
    elif kind == "queries":
        spec.update(queries=args.queries)
    return spec


async def run_attacker(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).resolve()),
        "--attacker",
        kind,
        "--spec",
        json.dumps(spec),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    lines = out.decode().strip().splitlines()
    if process.returncode != 0 or not lines:
        return {"error": f"the attacker exited with {process.returncode}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


@dataclass
class Row:
    name: str
    probe: dict[str, Any]
    rss_mb: float
    kept_mb: float
    log_bytes: int
    log_lines: int
    longest_line: int
    cpu: float
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)

    def misses(self) -> list[str]:
        missed = []
        if not self.probe["stall"] < TARGET_STALL_MS:  # NaN: nothing arrived
            missed.append("stall")
        if self.probe["lost"]:
            missed.append("lost")
        if self.rss_mb >= TARGET_RSS_MB:
            missed.append("RSS")
        if self.log_bytes >= TARGET_LOG_BYTES:
            missed.append("log")
        if sum(self.details.get(STILL_OPEN, {}).values()):
            missed.append("held open")
        return missed


async def measure(
    name: str,
    probe: Probe,
    gw: Gateway,
    args: argparse.Namespace,
    attack: asyncio.Future[dict[str, Any]] | None,
) -> Row:
    """One window: from now until ``attack`` is done (or ``--baseline`` s) and all settled."""
    rss0 = gw.rss_kib()
    peak_reset = gw.reset_peak()
    log0, cpu0 = gw.log_size(), common.cpu_seconds(gw.pid)
    first, started = probe.seq, time.monotonic()
    sampled = rss0

    async def sample() -> None:
        nonlocal sampled
        while True:
            sampled = max(sampled, gw.rss_kib())
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        details = await attack if attack is not None else {}
        if attack is None:
            await asyncio.sleep(args.baseline)
        await wait_until_idle(gw.pid, args.drain)
        last = probe.seq
        await probe.settle(first, last, args.drain)
    finally:
        sampler.cancel()
    ended = time.monotonic()
    peak = max(sampled, gw.peak_kib() if peak_reset else 0)
    cpu = common.cpu_seconds(gw.pid) - cpu0
    log1 = gw.log_size()
    with open(gw.log, "rb") as log:
        log.seek(log0)
        written = log.read(log1 - log0)
    lines = written.splitlines()
    stats = probe.window(first, last, started, ended)
    await asyncio.sleep(args.pause)  # quiet: what the gateway still holds afterwards
    return Row(
        name=name,
        probe=stats,
        rss_mb=(peak - rss0) / 1024,
        kept_mb=(gw.rss_kib() - rss0) / 1024,
        log_bytes=log1 - log0,
        log_lines=len(lines),
        longest_line=max((len(line) for line in lines), default=0),
        cpu=cpu,
        seconds=ended - started,
        details=details,
    )


def ms(value: float) -> str:
    return "-" if value != value else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def human_bytes(count: int) -> str:
    if count >= MB:
        return f"{count / MB:.1f} MB"
    if count >= 1024:
        return f"{count / 1024:.0f} KB"
    return f"{count} B"


def print_rows(rows: Sequence[Row]) -> None:
    headers = [
        "window",
        "s",
        "msgs",
        "p50 ms",
        "p99 ms",
        "worst ms",
        "gap ms",
        "stall ms",
        "lost",
        "refused",
        "disc.",
        "RSS +MB",
        "kept MB",
        "log",
        "log lines",
        "CPU s",
        "targets",
    ]
    table = [
        [
            r.name,
            f"{r.seconds:.1f}",
            r.probe["messages"],
            ms(r.probe["p50"]),
            ms(r.probe["p99"]),
            ms(r.probe["worst"]),
            ms(r.probe["gap"]),
            ms(r.probe["stall"]),
            r.probe["lost"],
            r.probe["refused"],
            r.probe["disconnects"],
            f"{r.rss_mb:.1f}",
            f"{r.kept_mb:.1f}",
            human_bytes(r.log_bytes),
            r.log_lines,
            f"{r.cpu:.2f}",
            "met" if not r.misses() else "missed: " + ", ".join(r.misses()),
        ]
        for r in rows
    ]
    print(common.table(headers, table))


async def bench(args: argparse.Namespace, workdir: Path) -> list[Row]:
    gw = start_gateway(args, workdir)
    rows: list[Row] = []
    try:
        pin_gateway(gw.pid, args.server_cpu)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            await wait_until_serving(gw, http)
            print(f"gateway: `bow-gateway serve` (pid {gw.pid}) on {gw.url}, CPU {args.server_cpu}")
            probe = Probe(gw.url, args.interval)
            await probe.connect()
            helpers = [
                asyncio.create_task(probe.keep_connected()),
                asyncio.create_task(probe.post_forever(http)),
            ]
            try:
                await asyncio.sleep(1.0)  # warm up
                rows.append(await measure("baseline", probe, gw, args, None))
                print_progress(rows[-1])
                for kind in args.attacks:
                    spec = attack_spec(kind, args, gw)
                    attack = asyncio.ensure_future(run_attacker(kind, spec))
                    rows.append(await measure(kind, probe, gw, args, attack))
                    print_progress(rows[-1])
                    if gw.process.poll() is not None:
                        print(f"  the gateway exited ({gw.process.returncode})")
                        break
            finally:
                for helper in helpers:
                    helper.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)
                await asyncio.gather(*probe.tasks, return_exceptions=True)
                if probe.client is not None and probe.client.connected:
                    await probe.client.disconnect()
    finally:
        gw.stop()
    return rows


def print_progress(row: Row) -> None:
    p = row.probe
    print(
        f"- {row.name}: stall {ms(p['stall'])} ms (worst latency {ms(p['worst'])}, p99 "
        f"{ms(p['p99'])}), lost {p['lost']}, RSS +{row.rss_mb:.1f} MB (kept {row.kept_mb:.1f}), "
        f"log {human_bytes(row.log_bytes)} in {row.log_lines} lines (longest "
        f"{human_bytes(row.longest_line)}), CPU {row.cpu:.2f} s",
        flush=True,
    )
    if row.details:
        print(f"  attacker: {json.dumps(row.details)}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated, in order")
    parser.add_argument("--source", help="run the gateway of this checkout (default: installed)")
    parser.add_argument("--interval", type=float, default=0.02, help="s between honest messages")
    parser.add_argument("--baseline", type=float, default=3.0, help="s without attack first")
    parser.add_argument("--pause", type=float, default=3.0, help="s of quiet after each window")
    parser.add_argument("--drain", type=float, default=20.0, help="s to wait for the gateway")
    parser.add_argument("--frames", type=int, default=20_000)
    parser.add_argument("--frame-seconds", type=float, default=10.0)
    parser.add_argument("--frame-connections", type=int, default=4, help="at a time")
    parser.add_argument("--binary-seconds", type=float, default=5.0)
    parser.add_argument("--binary-connections", type=int, default=1, help="at a time")
    parser.add_argument("--frame-bytes", type=int, default=900_000, help="per binary frame")
    parser.add_argument("--rss-cap", type=int, default=2048, help="MB: binary attacks stop")
    parser.add_argument("--holders", type=int, default=2_000)
    parser.add_argument("--hold", type=float, default=8.0, help="s, once all are open")
    parser.add_argument("--holder-concurrency", type=int, default=100, help="opening at a time")
    parser.add_argument("--queries", type=int, default=349_000)
    parser.add_argument(
        "--quiet", type=float, default=30.0, help="s to wait for a quiet machine first (0: none)"
    )
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--attacker", choices=ATTACKS, help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.attacker:
        attacker_main(args.attacker, json.loads(args.spec))
        return 0
    args.attacks = [a for a in args.attacks.split(",") if a]
    unknown = set(args.attacks) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks {sorted(unknown)}: choose among {', '.join(ATTACKS)}")

    raise_open_files_limit()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("two CPUs are needed: one for the gateway, one for the clients")
    print(common.environment(["aiohttp", "python-socketio", "python-engineio", "PyJWT"]))
    print(f"bow_gateway: {args.source or git_state()}")
    os.sched_setaffinity(0, {args.client_cpu})  # the attackers inherit it
    if args.quiet > 0:
        common.wait_for_quiet(args.quiet)
    print(
        f"honest listener and its POSTs (pid {os.getpid()}) and the attackers on CPU "
        f"{args.client_cpu}; a message every {args.interval * 1000:g} ms",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bow-attack-") as workdir:
        rows = asyncio.run(bench(args, Path(workdir)))
    print()
    print(
        "Per window: the honest listener's latency (POST start to receipt), longest gap between "
        "receipts, stall = max(worst, gap - interval); lost = answered 204, never received; "
        "refused = not 204; RSS +MB = peak growth, kept = still held after the pause; log = bytes "
        "the gateway wrote; CPU = the gateway's. Targets: stall < 250 ms, RSS < 64 MB, log < 1 MB, "
        "nothing lost, no holder still open after its hold."
    )
    print_rows(rows)
    missed = [row.name for row in rows[1:] if row.misses()]
    print(f"\nload average now: {common.load_average()}")
    if missed:
        print(f"FAILED: targets missed by {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
