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
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import aiohttp
from lib import machine
from lib.attacks import ATTACKS
from lib.attacks.inbound import write_history
from lib.attacks.probe import Probe
from lib.attacks.report import Row, measure, print_progress, print_rows
from lib.attacks.runner import attack_spec, attacker_main, run_attacker
from lib.attacks.served import start_gateway, wait_until_idle, wait_until_serving


async def bench(args: argparse.Namespace, workdir: Path) -> list[Row]:
    gw = start_gateway(args, workdir)
    rows: list[Row] = []
    try:
        machine.pin_gateway(gw.pid, args.server_cpu)
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


def build_parser() -> argparse.ArgumentParser:
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.attacker:
        attacker_main(args.attacker, json.loads(args.spec))
        return 0
    args.attacks = [a for a in args.attacks.split(",") if a]
    unknown = set(args.attacks) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks {sorted(unknown)}: choose among {', '.join(ATTACKS)}")

    machine.raise_open_files_limit()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("two CPUs are needed: one for the gateway, one for the clients")
    print(machine.environment(["aiohttp", "python-socketio", "python-engineio", "PyJWT"]))
    print(f"bow_gateway: {args.source or machine.git_state()}")
    os.sched_setaffinity(0, {args.client_cpu})  # the attackers inherit it
    if args.quiet > 0:
        machine.wait_for_quiet(args.quiet)
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
    print(f"\nload average now: {machine.load_average()}")
    if missed:
        print(f"FAILED: targets missed by {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
