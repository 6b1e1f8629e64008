"""Attack benchmark: what hostile clients cost an honest listener, and the gateway (issues 11
and 27).

Run:  .venv/bin/python bench/attack_bench.py [--attacks frames,binary,...]   # all, in this order:
          frames, binary, binary-token, holders, queries (issue 11); flywheel-flood,
          flywheel-publish, recovery, replay, filters, sse-slow, auth-brute (issue 27)
      .venv/bin/python bench/attack_bench.py --source /tmp/bow-before   # another checkout

A plain script, not a test; about three minutes, once the machine is quiet (``--quiet``: at most
30 s of waiting). It starts ``bow-gateway serve --config`` (``python -m bow_gateway serve``: JSON
log lines on stderr, gc_freeze on, in-process backplane, ``outbound.timeout`` 5 s) with a file
of its own, written to its work directory: the embedded default (the same tables and settings),
plus what issue 27's attacks need, which the embedded default leaves out: anonymous listeners on
every protocol (``anonymous_criteria = {role = "anonymous"}``), client publishes
(``create_message_from_publish``: a module beside the file makes ``P {topic} {body}`` the message
``topic`` to an audience nobody has, ``[{"__id": "NOBODY/1"}]``) and ``/chat/#`` histories of
10,000 entries (the embedded default keeps 1,000). Its stdout and stderr go to one log file; it
is pinned to CPU 0 with ``taskset``; this process and the attackers pin themselves to CPU 1.
``--source DIR`` runs the gateway of another checkout (``git archive <commit> | tar -x -C DIR``)
instead of the installed one, through ``PYTHONPATH``.

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
  with 349,000 empty queries (1,047,024 bytes, under the 1 MiB body limit);
- ``flywheel-flood``: ``--flood-connections`` (30) Flywheel connections (``/broker``) without a
  token, each sending anonymous binds ``B {"subscribe": [...]}`` and ``B {"unsubscribe": [...]}``
  in turn, of the same ``--filters-each`` (100) filters of ``--filter-levels`` (32) levels
  (distinct per connection, 13.5 KB a frame), as fast as the gateway reads them, for
  ``--flood-seconds`` (4 s), each connection reopened when the gateway closes it (the honest
  POSTs must all be answered meanwhile: ``refused`` counts those that were not);
- ``flywheel-publish``: ``--publishers`` (10) Flywheel connections bound with one ordinary
  end-user token (``PUBLISHER/1``, a ``sessionId`` each), then sending client publishes
  ``P bench/flood {body}`` (a ``--publish-bytes`` body, 1,000) as fast as the gateway reads them
  for ``--publish-seconds`` (4 s), each reopened and bound again when closed;
- ``recovery``: the backend (the attacker, with the inbound's credentials) POSTs one small
  message, then ``--recovery-messages`` (4,000) messages of ``--big-bytes`` (100 KB; 400 MB in
  all, ``--post-concurrency`` at a time, 8), all to an audience nobody has; then
  ``--recovery-streams`` (100) anonymous SSE streams (``/events``) open at once with the first
  message's position as ``Last-Event-ID``, each waiting ``--sse-wait`` (3 s) for its first event
  (``__gap too_old`` once the window has let that position go);
- ``replay``: before its window (and not measured), this process writes a topic history of
  ``--history-entries`` (10,000) messages of ``/chat/big`` (a ``--history-bytes`` text each,
  100) to the admins, in POSTs of batches of 1,000, and waits until the gateway is idle; then
  ``--replayers`` (30) Gobbler connections (``/gobbler``, one admin's token,
  ``REPLAY/1``) each send ``+ /chat/big 0 100000`` and read the replay until ``#fetch-done``,
  an error or a close, for ``--replay-seconds`` (10 s) at most;
- ``filters``: ``--filter-sockets`` (400) Socket.IO protocol-2 sockets (raw websockets,
  ``--holder-concurrency`` opening at a time), each authenticated anonymously (a ``null`` token)
  then subscribing ``--filters-each`` (100) filters of ``--filter-levels`` (32) levels, distinct
  across sockets (40,000 in all), all held (pings answered) for ``--filter-hold`` (5 s) once all
  are open;
- ``sse-slow``: ``--slow-streams`` (100, ``outbound.max_sockets_per_id``) SSE streams of one
  token (``SLOW/1``) that never read, then the backend POSTs them ``--slow-messages`` (40)
  messages of ``--big-bytes`` (100 KB; 4 MB for each stream), ``--post-concurrency`` at a time,
  and the streams are held ``--slow-hold`` (2 s) more;
- ``auth-brute``: ``--auth-posts`` (500) inbound POSTs with wrong Basic Auth passwords (each a
  different one), ``--auth-concurrency`` (20) at a time, as fast as the gateway answers, from
  ``--auth-address`` (127.0.0.2: the honest backend posts from 127.0.0.1, and the gateway blocks
  an address, its right credentials included); 429s are expected after the first 60.

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

Targets (issues 11 and 27), per attack: stall under 250 ms, RSS growth under 64 MB, log under
1 MB, no honest message lost; and no holder still open at the end of its hold (every connection
that is not authenticated within ``outbound.timeout`` is closed). The exit status is 1 when an
attack misses one of them.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import random
import signal
import string
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
ATTACKS = (
    "frames",
    "binary",
    "binary-token",
    "holders",
    "queries",
    "flywheel-flood",
    "flywheel-publish",
    "recovery",
    "replay",
    "filters",
    "sse-slow",
    "auth-brute",
)
NOBODY = "NOBODY/1"  # an id no listener has: the audience of what no socket may receive
HISTORY_TOPIC = "/chat/big"  # kept: the gateway's [[history]] keeps /chat/#
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


PASSTHROUGH = "bow_gateway.inbounds.passthrough:create_message_from_request_body"
CONFIG = f"""\
# attack_bench.py's gateway: the embedded default (bow_gateway/standalone.py's embedded_default),
# plus anonymous listeners, client publishes and /chat/ histories of 10,000 (issue 27's attacks).
[middleware]
log_interval = 60

[inbound]
realm = "bow-gateway"
username = "{gateway.USER}"
password = "{gateway.PASSWORD}"

[outbound]
timeout = 5

[[middlewares]]
version = "{VERSION}"
create_criteria_from_listener_details = "bow_gateway.middlewares.claims:criteria_from_claim"
options = {{ claim = "criteria" }}

[[inbounds]]
path = "{INBOUND}"
create_message_from_request_body = "{PASSTHROUGH}"
middleware_version = "{VERSION}"

[[inbounds]]
path = "/api/message/{{topic:.+}}"
create_message_from_request = "bow_gateway.inbounds.gobbler:GobblerInbound"
options = {{ audience = [{{ role = "admin" }}] }}
middleware_version = "{VERSION}"

[[history]]
filter = "/chat/#"
max_count = 10000
max_age = 86400

[[outbounds]]
version = "{VERSION}"
create_listener_details_from_token = "bow_gateway.outbounds.jwt:JwtOutbound"
options = {{ algorithms = ["HS256"], secret_env = "BOW_JWT_SECRET" }}
middleware_version = "{VERSION}"
anonymous_criteria = {{ role = "anonymous" }}
create_message_from_publish = "attack_plugins:publish"
"""
PLUGINS = (
    '"""attack_bench.py\'s client publishes: ``P {topic} {body}`` is the message ``topic``, its\n'
    f'payload the body, to nobody (no listener has the id {NOBODY})."""\n\n\n'
    "def publish(listener_details, topic, body):\n"
    f'    return {{"name": topic, "payload": body, "audience": [{{"__id": "{NOBODY}"}}]}}\n'
)


def start_gateway(args: argparse.Namespace, workdir: Path) -> Gateway:
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("BOW_")}
    env.update(BOW_JWT_SECRET=gateway.SECRET, BOW_INBOUND_PASSWORD=gateway.PASSWORD)
    if args.source:
        env["PYTHONPATH"] = str(package_layout(Path(args.source), workdir))
    config = workdir / "gateway.toml"  # beside it, its plugin module (and the cwd)
    config.write_text(CONFIG, encoding="utf-8")
    (workdir / "attack_plugins.py").write_text(PLUGINS, encoding="utf-8")
    log = workdir / "gateway.log"
    command = [sys.executable, "-m", "bow_gateway", "serve", "--config", str(config)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
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


def topic_filters(prefix: str, count: int, levels: int) -> list[str]:
    """``count`` distinct filters of ``levels`` levels each (3 random characters a level, the
    first one naming ``prefix`` and the filter): 100 of 32 levels are 13 KB of JSON, a frame
    under ``outbound.max_incoming_bytes``."""
    rng = random.Random(prefix)
    alphabet = string.ascii_lowercase + string.digits
    filters = []
    for i in range(count):
        levels_after = ("".join(rng.choices(alphabet, k=3)) for _ in range(levels - 1))
        filters.append("/".join([f"{prefix}-{i}", *levels_after]))
    return filters


def plain_ws_url(url: str, path: str, query: str = "") -> str:
    return url.replace("http://", "ws://", 1) + f"{path}?v={VERSION}" + query


def basic_auth(password: str = gateway.PASSWORD) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Authorization": aiohttp.encode_basic_auth(gateway.USER, password),
    }


async def post_all(
    http: aiohttp.ClientSession,
    url: str,
    bodies: Sequence[bytes],
    concurrency: int,
    headers: dict[str, str] | None = None,
) -> collections.Counter[str]:
    """POST every body, ``concurrency`` at a time; how many got each status."""
    statuses: collections.Counter[str] = collections.Counter()
    queue = iter(bodies)

    async def poster() -> None:
        for body in queue:
            try:
                async with http.post(url, data=body, headers=headers or basic_auth()) as r:
                    await r.read()
                    statuses[str(r.status)] += 1
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                statuses[type(error).__name__] += 1

    await asyncio.gather(*(poster() for _ in range(concurrency)))
    return statuses


async def flywheel_attack(
    spec: dict[str, Any], frames: Any, hello: str | None = None
) -> dict[str, Any]:
    """``spec["connections"]`` Flywheel connections, each sending ``hello`` (and waiting for its
    answer) then the frames ``frames(n)`` yields, in turn, as fast as the gateway reads them,
    for ``spec["seconds"]``; a connection the gateway closes is opened again."""
    counts: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + spec["seconds"]

    async def read(ws: aiohttp.ClientWebSocketResponse) -> None:
        async for message in ws:
            if message.type is aiohttp.WSMsgType.TEXT:
                kind = message.data[:1]
                counts[f"{kind} frames received"] += 1
                if kind == "B" and '"description"' in message.data:
                    counts["B answers with errors"] += 1
                elif message.data.startswith("R $remote/"):
                    counts["R $remote frames (errors, alerts)"] += 1

    async def attacker(http: aiohttp.ClientSession, n: int) -> None:
        sent = frames(n)
        while time.monotonic() < deadline:
            try:
                ws = await http.ws_connect(plain_ws_url(spec["url"], "/broker"), autoping=True)
                if hello is not None:
                    await ws.send_str(hello.replace("{n}", str(n)))
                    answer = await ws.receive(timeout=5)
                    if answer.type is not aiohttp.WSMsgType.TEXT:
                        raise ConnectionError(f"no bind answer: {answer.type.name}")
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                counts[f"connect failures ({type(error).__name__})"] += 1
                await asyncio.sleep(0.05)
                continue
            counts["connections"] += 1
            reading = asyncio.create_task(read(ws))
            try:
                while time.monotonic() < deadline and not reading.done() and not ws.closed:
                    await ws.send_str(next(sent))
                    counts["frames sent"] += 1
                    await asyncio.sleep(0)  # let the reader see an answer, or a close
            except (aiohttp.ClientError, OSError):
                counts["send failures"] += 1
            if reading.done() or ws.closed:
                await asyncio.gather(reading, return_exceptions=True)
                counts[f"closed by the gateway ({ws.close_code})"] += 1
            reading.cancel()
            await ws.close()

    started = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(attacker(http, n) for n in range(spec["connections"])))
    return {**counts, "seconds": round(time.monotonic() - started, 2)}


async def attack_flywheel_flood(spec: dict[str, Any]) -> dict[str, Any]:
    def frames(n: int) -> Any:
        mine = topic_filters(f"fly{n}", spec["filters"], spec["levels"])
        subscribe = "B " + json.dumps({"subscribe": mine})
        unsubscribe = "B " + json.dumps({"unsubscribe": mine})
        return itertools.cycle([subscribe, unsubscribe])

    return {
        "frame bytes": len(next(frames(0))),
        **await flywheel_attack(spec, frames),  # anonymous: no auth in any bind
    }


async def attack_flywheel_publish(spec: dict[str, Any]) -> dict[str, Any]:
    frame = "P bench/flood " + "x" * spec["body_bytes"]
    bind = {"sessionId": "publisher-{n}", "auth": {"type": "Bearer", "token": spec["token"]}}
    return await flywheel_attack(spec, lambda n: itertools.repeat(frame), "B " + json.dumps(bind))


async def first_sse_event(response: aiohttp.ClientResponse, limit: float) -> str:
    """The first event of an SSE stream (``__gap too_old``...), or why there is none."""
    try:
        block = await asyncio.wait_for(response.content.readuntil(b"\n\n"), limit)
    except TimeoutError:
        return f"no event within {limit:g} s"
    except (aiohttp.ClientError, ValueError, OSError) as error:
        return f"ended ({type(error).__name__})"
    fields = dict(
        line.split(": ", 1) for line in block.decode(errors="replace").splitlines() if ": " in line
    )
    event = fields.get("event", "(id only)")
    try:
        data = json.loads(fields.get("data", "null"))
    except ValueError:
        data = None
    reason = data.get("reason") if isinstance(data, dict) else None
    return f"{event} {reason}" if reason else event


async def attack_recovery(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    url = spec["url"]
    filler = "x" * spec["message_bytes"]
    body = json.dumps({"name": "bulk", "audience": [{"__id": NOBODY}], "blob": filler}).encode()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        marker = {"name": "bulk", "audience": [{"__id": NOBODY}], "marker": True}
        async with http.post(url + INBOUND, json=marker, headers=basic_auth()) as r:
            await r.read()
            since = r.headers.get("Bow-Position", "")
        statuses = await post_all(
            http, url + INBOUND, [body] * spec["messages"], spec["concurrency"]
        )
        posted = time.monotonic() - started
        opened = time.monotonic()

        async def stream() -> tuple[str, float, str]:
            headers = {"Last-Event-ID": since, "Accept": "text/event-stream"}
            try:
                async with http.get(f"{url}/events?v={VERSION}", headers=headers) as response:
                    answered = time.monotonic() - opened
                    if response.status != 200:
                        return str(response.status), answered, "refused"
                    return "200", answered, await first_sse_event(response, spec["wait"])
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                return type(error).__name__, time.monotonic() - opened, "failed"

        streams = await asyncio.gather(*(stream() for _ in range(spec["streams"])))
    return {
        "Last-Event-ID": since,
        "POSTs": dict(statuses),
        "MB posted": round(len(body) * spec["messages"] / MB),
        "seconds posting": round(posted, 2),
        "streams": dict(collections.Counter(status for status, _, _ in streams)),
        "first events": dict(collections.Counter(first for _, _, first in streams)),
        "slowest stream's answer (s)": round(max(t for _, t, _ in streams), 2),
        "seconds": round(time.monotonic() - started, 2),
    }


async def write_history(http: aiohttp.ClientSession, spec: dict[str, Any]) -> dict[str, Any]:
    """The topic history ``replay`` reads, written by the backend before its window: batches of
    1,000 messages of ``HISTORY_TOPIC`` to the admins."""
    started = time.monotonic()
    entry = {"name": HISTORY_TOPIC, "audience": [{"role": "admin"}], "text": "x" * spec["bytes"]}
    batches = [
        json.dumps([entry] * min(1000, spec["entries"] - first)).encode()
        for first in range(0, spec["entries"], 1000)
    ]
    statuses = await post_all(http, spec["url"] + INBOUND, batches, 1)
    return {
        f"{HISTORY_TOPIC}: POSTs of 1,000": dict(statuses),
        "seconds": round(time.monotonic() - started, 2),
    }


async def attack_replay(spec: dict[str, Any]) -> dict[str, Any]:
    counts: collections.Counter[str] = collections.Counter()
    fetched: list[int] = []  # messages each connection received
    durations: list[float] = []  # from the command to #fetch-done
    started = time.monotonic()
    url = spec["url"]
    command = f"+ {HISTORY_TOPIC} 0 100000"

    async def replayer(http: aiohttp.ClientSession) -> None:
        query = "&token=" + spec["token"]
        received = 0
        try:
            ws = await http.ws_connect(plain_ws_url(url, "/gobbler", query), autoping=True)
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            counts[f"connect failures ({type(error).__name__})"] += 1
            return
        asked = time.monotonic()
        try:
            await ws.send_str(command)
            while True:
                left = deadline - time.monotonic()
                message = await ws.receive(timeout=max(left, 0.001))
                if message.type is not aiohttp.WSMsgType.TEXT:
                    counts[f"closed by the gateway ({ws.close_code})"] += 1
                    break
                text = message.data
                if text.startswith("#fetch-done"):
                    durations.append(time.monotonic() - asked)
                    counts["fetches done"] += 1
                    break
                if text.startswith("!"):
                    counts[text.split(" ", 1)[0]] += 1
                    break
                if not text.startswith("#"):
                    received += 1
        except TimeoutError:
            counts["still fetching at the deadline"] += 1
        except (aiohttp.ClientError, OSError) as error:
            counts[type(error).__name__] += 1
        fetched.append(received)
        await ws.close()

    deadline = time.monotonic() + spec["seconds"]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(replayer(http) for _ in range(spec["connections"])))
    return {
        "command": command,
        **counts,
        "messages received (all connections)": sum(fetched),
        "most by one connection": max(fetched, default=0),
        "slowest fetch (s)": round(max(durations, default=0.0), 2),
        "seconds": round(time.monotonic() - started, 2),
    }


async def sio_ack(ws: aiohttp.ClientWebSocketResponse, ack: int) -> str:
    """The arguments of the acknowledgement ``ack`` (Engine.IO pings answered meanwhile)."""
    prefix = f"43{ack}["
    while True:
        message = await ws.receive(timeout=10)
        if message.type is not aiohttp.WSMsgType.TEXT:
            raise ConnectionError(f"closed ({ws.close_code}) before the acknowledgement")
        if message.data == "2":
            await ws.send_str("3")
        elif message.data.startswith(prefix):
            return str(message.data[len(prefix) - 1 :])


async def attack_filters(spec: dict[str, Any]) -> dict[str, Any]:
    counts: collections.Counter[str] = collections.Counter()
    semaphore = asyncio.Semaphore(spec["concurrency"])
    closed = 0
    url = ws_url(spec["url"]) + "&proto=2"

    async def socket(http: aiohttp.ClientSession, n: int, opened: asyncio.Event) -> None:
        nonlocal closed
        add = topic_filters(f"sio{n}", spec["filters"], spec["levels"])
        try:
            async with semaphore:
                try:
                    ws = await http.ws_connect(url, autoping=True)
                    await ws.receive(timeout=10)  # Engine.IO OPEN
                    await ws.send_str("40")
                    await ws.receive(timeout=10)  # 40{"sid": ...}
                    await ws.send_str('421["authenticate",null,{}]')  # anonymous
                    authenticated = await sio_ack(ws, 1)
                    counts["authenticated" if '"error"' not in authenticated else "refused"] += 1
                    await ws.send_str("422" + json.dumps(["subscribe", {"add": add}]))
                    answer = await sio_ack(ws, 2)
                    counts["subscribe refused" if '"error"' in answer else "subscribed"] += 1
                except (TimeoutError, ConnectionError, aiohttp.ClientError, OSError) as error:
                    counts[f"failed ({type(error).__name__})"] += 1
                    return
        finally:
            opened.set()
        await reader(ws)  # until the gateway closes it, or the end of the hold
        closed += 1

    started = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        events = [asyncio.Event() for _ in range(spec["sockets"])]
        tasks = [asyncio.create_task(socket(http, n, e)) for n, e in enumerate(events)]
        await asyncio.gather(*(e.wait() for e in events))
        open_seconds = time.monotonic() - started
        metrics = await sockets_connected(http, spec["url"])
        await asyncio.sleep(spec["hold"])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "subscribe bytes": len(json.dumps(topic_filters("sio0", spec["filters"], spec["levels"]))),
        **counts,
        "seconds to open all": round(open_seconds, 2),
        "bow_sockets_connected once open": metrics,
        "held (s)": spec["hold"],
        "closed by the gateway": closed,
        "seconds": round(time.monotonic() - started, 2),
    }


async def attack_sse_slow(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    url = spec["url"]
    audience = [{"__id": spec["listener"]}]
    body = json.dumps({"name": "big", "audience": audience, "blob": "x" * spec["bytes"]}).encode()
    responses: list[aiohttp.ClientResponse] = []
    refused: collections.Counter[str] = collections.Counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        headers = {"Authorization": "Bearer " + spec["token"], "Accept": "text/event-stream"}

        async def open_stream() -> None:
            try:
                response = await http.get(f"{url}/events?v={VERSION}", headers=headers)
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                refused[type(error).__name__] += 1
                return
            if response.status == 200:
                responses.append(response)  # never read
            else:
                refused[str(response.status)] += 1
                response.close()

        await asyncio.gather(*(open_stream() for _ in range(spec["streams"])))
        metrics_open = await sockets_connected(http, url)
        statuses = await post_all(
            http, url + INBOUND, [body] * spec["messages"], spec["concurrency"]
        )
        await asyncio.sleep(spec["hold"])
        metrics_after = await sockets_connected(http, url)
        for response in responses:
            response.close()
    return {
        "streams open": len(responses),
        "streams refused": dict(refused),
        "POSTs": dict(statuses),
        "MB sent to each stream": round(len(body) * spec["messages"] / MB, 1),
        "bow_sockets_connected once open": metrics_open,
        "bow_sockets_connected after the messages": metrics_after,
        "seconds": round(time.monotonic() - started, 2),
    }


async def attack_auth_brute(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    body = json.dumps({"name": "x", "audience": [{"__id": NOBODY}]}).encode()
    guesses = iter(range(spec["posts"]))
    # From another loopback address than the honest backend's (127.0.0.1): the gateway blocks
    # an address, the right credentials included.
    connector = aiohttp.TCPConnector(limit=0, local_addr=(spec["address"], 0))
    async with aiohttp.ClientSession(connector=connector) as http:
        statuses: collections.Counter[str] = collections.Counter()

        async def guesser() -> None:
            for guess in guesses:
                headers = basic_auth(f"wrong-{guess}")
                try:
                    async with http.post(spec["url"] + INBOUND, data=body, headers=headers) as r:
                        await r.read()
                        statuses[str(r.status)] += 1
                except (TimeoutError, aiohttp.ClientError, OSError) as error:
                    statuses[type(error).__name__] += 1

        await asyncio.gather(*(guesser() for _ in range(spec["concurrency"])))
    return {
        "from": spec["address"],
        "statuses": dict(statuses),
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
        "flywheel-flood": attack_flywheel_flood,
        "flywheel-publish": attack_flywheel_publish,
        "recovery": attack_recovery,
        "replay": attack_replay,
        "filters": attack_filters,
        "sse-slow": attack_sse_slow,
        "auth-brute": attack_auth_brute,
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
    elif kind == "flywheel-flood":
        spec.update(
            connections=args.flood_connections,
            seconds=args.flood_seconds,
            filters=args.filters_each,
            levels=args.filter_levels,
        )
    elif kind == "flywheel-publish":
        spec.update(
            connections=args.publishers,
            seconds=args.publish_seconds,
            body_bytes=args.publish_bytes,
            token=gateway_token("PUBLISHER/1", {"role": "user"}),
        )
    elif kind == "recovery":
        spec.update(
            messages=args.recovery_messages,
            message_bytes=args.big_bytes,
            concurrency=args.post_concurrency,
            streams=args.recovery_streams,
            wait=args.sse_wait,
        )
    elif kind == "replay":
        spec.update(
            connections=args.replayers,
            entries=args.history_entries,
            bytes=args.history_bytes,
            seconds=args.replay_seconds,
            token=gateway_token("REPLAY/1", {"role": "admin"}),
        )
    elif kind == "filters":
        spec.update(
            sockets=args.filter_sockets,
            filters=args.filters_each,
            levels=args.filter_levels,
            hold=args.filter_hold,
            concurrency=args.holder_concurrency,
        )
    elif kind == "sse-slow":
        spec.update(
            listener="SLOW/1",
            token=gateway_token("SLOW/1", {"role": "user"}),
            streams=args.slow_streams,
            messages=args.slow_messages,
            bytes=args.big_bytes,
            concurrency=args.post_concurrency,
            hold=args.slow_hold,
        )
    elif kind == "auth-brute":
        spec.update(
            posts=args.auth_posts, concurrency=args.auth_concurrency, address=args.auth_address
        )
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
                    if kind == "replay":  # its history, before its window
                        written = await write_history(http, spec)
                        await asyncio.sleep(0.5)
                        await wait_until_idle(gw.pid, args.drain)
                        print(f"  before replay's window: {json.dumps(written)}", flush=True)
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
    parser.add_argument("--filters-each", type=int, default=100, help="filters, per connection")
    parser.add_argument("--filter-levels", type=int, default=32, help="levels, per filter")
    parser.add_argument("--flood-connections", type=int, default=30)
    parser.add_argument("--flood-seconds", type=float, default=4.0)
    parser.add_argument("--publishers", type=int, default=10)
    parser.add_argument("--publish-seconds", type=float, default=4.0)
    parser.add_argument("--publish-bytes", type=int, default=1000, help="per P frame's body")
    parser.add_argument("--big-bytes", type=int, default=100_000, help="recovery, sse-slow")
    parser.add_argument("--post-concurrency", type=int, default=8, help="backend POSTs at once")
    parser.add_argument("--recovery-messages", type=int, default=4000)
    parser.add_argument("--recovery-streams", type=int, default=100)
    parser.add_argument("--sse-wait", type=float, default=3.0, help="s for a stream's 1st event")
    parser.add_argument("--replayers", type=int, default=30)
    parser.add_argument("--history-entries", type=int, default=10_000)
    parser.add_argument("--history-bytes", type=int, default=100, help="per entry's text")
    parser.add_argument("--replay-seconds", type=float, default=10.0, help="s, at most")
    parser.add_argument("--filter-sockets", type=int, default=400)
    parser.add_argument("--filter-hold", type=float, default=5.0, help="s, once all are open")
    parser.add_argument("--slow-streams", type=int, default=100)
    parser.add_argument("--slow-messages", type=int, default=40)
    parser.add_argument("--slow-hold", type=float, default=2.0, help="s after the messages")
    parser.add_argument("--auth-posts", type=int, default=500)
    parser.add_argument("--auth-concurrency", type=int, default=20, help="POSTs at once")
    parser.add_argument("--auth-address", default="127.0.0.2", help="the guesser's address")
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
