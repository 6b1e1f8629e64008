"""The gateway that ``delivery_bench.py`` starts in a process of its own (``lib/gateways.py``).

Run by path, ``python bench/lib/gateway.py [options]`` (``bench/lib`` is then its ``sys.path[0]``,
and ``PYTHONPATH`` may name another checkout's bow_gateway): it imports nothing of ``lib``, only
the standard library and bow_gateway; the scripts import it for its constants and ``build``.

The quick-start gateway (as ``tests/support.standard_bow`` builds it): the bundled JWT outbound
v1.3, the claims middleware v1.1 and the pass-through inbound on ``/v1.2/messages``, with
``gc_freeze`` on as under ``bow-gateway serve`` (``--no-gc-freeze``: off), one instance with the
in-process backplane, or with ``--redis URL`` one instance of a gateway whose instances
share that Redis (``redis_bench.py`` starts one or two of them). Once serving, it prints one JSON
line on stdout (``{"port": ..., "pid": ...}``), then runs until SIGTERM, SIGINT or the end of its
stdin (so it never outlives the benchmark). SIGUSR1 starts cProfile, SIGUSR2 stops it and writes
the stats to the file given with ``--profile``. For ``history_bench.py``: ``--history JSON`` (the
``[[history]]`` rules, as ``BOW_HISTORY`` takes them) and ``--envelope`` (the inbound takes
``{"name", "payload", "audience"}`` or a JSON list of them, a batch, instead of the pass-through
body). ``--incoming-rate N``: a Socket.IO client may send N packets a second, not the guard's 20
(``fanout_bench.py --receipt``: every socket acknowledges every message).

It also takes commands, one a line, on its stdin, and answers each with one JSON line on stdout:
``gc`` (the cyclic garbage collector's collections per generation since the last ``gc``: count,
total and longest pause, timed with ``gc.callbacks``), ``objects`` (how many objects the
collector tracks, and how many are frozen; slow with millions), and two older experiments:
``freeze`` (``gc.collect()`` then ``gc.freeze()``) and ``disable`` (``gc.disable()``); for
``fanout_bench.py``: ``stall`` (the longest lateness of a timer rescheduled every 10 ms since the
last ``stall``, i.e. the longest event-loop stall, then reset) and ``sockets`` (sockets connected
and authenticated, and the disconnects so far by reason, from the gateway's metrics); for
``recovery_bench.py`` and ``restart_bench.py``: ``cpu`` (this process's CPU time in ns,
``CLOCK_PROCESS_CPUTIME_ID``: exact, where ``/proc/<pid>/stat`` counts 10 ms ticks) and
``collect`` (``gc.collect()``, to start a measurement without an earlier phase's garbage) and
``recoveries`` (the protocol-2 recovery counters of the metrics, by result and reason, and the
messages replayed; empty before protocol 2).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import logging
import os
import resource
import signal
import sys
import time
import tracemalloc
from typing import Any

from bow_gateway.inbounds.passthrough import (
    create_message_from_envelope,
    create_message_from_request_body,
)
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound

from bow_gateway import Bow

SECRET = "a-benchmark-secret-that-is-at-least-32-bytes-long"
USER, PASSWORD, REALM = "pusher", "bench-pusher", "Benchmark"
PATH = "/v1.2/messages"
OUTBOUND_VERSION = "v1.3"


def build(
    host: str,
    auth_timeout: float,
    max_buffered_bytes: int,
    redis: str | None = None,
    namespace: str = "bow",
    port: int = 0,
    gc_freeze: bool = True,
    history: list[dict[str, Any]] | None = None,
    envelope: bool = False,
    overrides: dict[str, Any] | None = None,
) -> Bow:
    config: dict[str, Any] = {
        "port": port,
        "host": host,
        "gc_freeze": gc_freeze,  # as under `bow-gateway serve`
        "redis": redis,
        "namespace": namespace,
        "inbound": {"realm": REALM, "username": USER, "password": PASSWORD},
        "outbound": {"timeout": auth_timeout, "max_buffered_bytes": max_buffered_bytes},
        "middleware": {"log_interval": None},
    }
    if history is not None:
        config["history"] = history
    for key, value in (overrides or {}).items():  # a table merged into the one above, if any
        merged = isinstance(value, dict) and isinstance(config.get(key), dict)
        config[key] = {**config[key], **value} if merged else value
    return (
        Bow(config)
        .middleware(version="v1.1", create_criteria_from_listener_details=criteria_from_claim())
        .inbound(
            path=PATH,
            create_message_from_request_body=(
                envelopes if envelope else create_message_from_request_body
            ),
            middleware_version="v1.1",
        )
        .outbound(
            version=OUTBOUND_VERSION,
            create_listener_details_from_token=JwtOutbound(secret=SECRET),
            middleware_version="v1.1",
        )
    )


def envelopes(body: Any) -> Any:
    """An envelope ``{"name", "payload", "audience"}``, or a list of them (a batch)."""
    if isinstance(body, list):
        return [create_message_from_envelope(item) for item in body]
    return create_message_from_envelope(body)


class GcClock:
    """Times every collection of the cyclic garbage collector, per generation."""

    def __init__(self) -> None:
        self._started: float | None = None
        self.reset()
        gc.callbacks.append(self._callback)

    def reset(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            generation, took = info["generation"], time.perf_counter() - self._started
            self.count[generation] += 1
            self.seconds[generation] += took
            self.longest[generation] = max(self.longest[generation], took)
            self._started = None

    def report(self) -> dict[str, object]:
        answer = {
            "collections": self.count,
            "seconds": self.seconds,
            "longest": self.longest,
        }
        self.reset()
        return answer


class StallProbe:
    """A callback rescheduled every ``interval`` s that records how late the event loop ran it."""

    def __init__(self, interval: float = 0.01) -> None:
        self._loop = asyncio.get_running_loop()
        self._interval = interval
        self._due = 0.0
        self.reset()
        self._schedule()

    def reset(self) -> None:
        self.longest = 0.0
        self.ticks = 0
        self.since = time.monotonic()

    def _schedule(self) -> None:
        self._due = self._loop.time() + self._interval
        self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        self.longest = max(self.longest, self._loop.time() - self._due)
        self.ticks += 1
        self._schedule()

    def report(self) -> dict[str, float]:
        answer = {
            "longest": self.longest,
            "ticks": self.ticks,
            "seconds": time.monotonic() - self.since,
        }
        self.reset()
        return answer


def socket_counts(bow: Bow) -> dict[str, object]:
    """Sockets connected and authenticated now, and disconnects so far by reason (metrics)."""
    counts: dict[str, float] = {"connected": 0.0, "authenticated": 0.0}
    disconnects: dict[str, float] = {}
    for metric in (bow.metrics.sockets_connected, bow.metrics.sockets_authenticated):
        for family in metric.collect():
            for sample in family.samples:
                key = "connected" if sample.name == "bow_sockets_connected" else "authenticated"
                counts[key] += sample.value
    for family in bow.metrics.disconnects.collect():
        for sample in family.samples:
            if sample.name == "bow_disconnects_total":
                disconnects[sample.labels["reason"]] = sample.value
    return {**counts, "disconnects": disconnects}


def recovery_counts(bow: Bow) -> dict[str, float]:
    """The metrics' recoveries by ``result/reason`` and ``replayed`` (protocol 2 only)."""
    counts: dict[str, float] = {}
    for name, label in (("recoveries", True), ("replayed", False)):
        metric = getattr(bow.metrics, name, None)
        if metric is None:
            continue
        for family in metric.collect():
            for sample in family.samples:
                if not sample.name.endswith("_total"):
                    continue
                key = "/".join(sample.labels.values()) if label else name
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def answer(
    command: str, clock: GcClock, probe: StallProbe | None = None, bow: Bow | None = None
) -> dict[str, object]:
    if command == "stall" and probe is not None:
        return {"stall": probe.report()}
    if command == "sockets" and bow is not None:
        return {"sockets": socket_counts(bow)}
    if command == "collect":  # a full collection now (then the freeze, if gc_freeze is on)
        started = time.perf_counter()
        collected = gc.collect()
        return {"collected": collected, "seconds": time.perf_counter() - started}
    if command == "cpu":
        return {"cpu_ns": time.process_time_ns()}
    if command == "recoveries" and bow is not None:
        return {"recoveries": recovery_counts(bow)}
    if command == "gc":
        return {"gc": clock.report()}
    if command.startswith("trace"):  # "trace" starts tracemalloc; "trace N": what N sockets hold
        return trace(command.partition(" ")[2])
    if command == "objects":  # both walk every object: the loop stalls meanwhile
        return {"objects": len(gc.get_objects()), "frozen": gc.get_freeze_count()}
    if command == "freeze":
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        return {"frozen": gc.get_freeze_count(), "seconds": time.perf_counter() - started}
    if command == "disable":
        gc.disable()
        return {"enabled": gc.isenabled()}
    return {"error": f"unknown command {command!r}"}


_traced: list[tracemalloc.Snapshot] = []


def trace(sockets: str) -> dict[str, object]:
    """Start tracemalloc (then a baseline, after a full collection), or, given how many sockets
    connected since, the growth per socket by file and line and by module, biggest first."""
    gc.collect()
    if not sockets:
        tracemalloc.start()
        _traced[:] = [tracemalloc.take_snapshot()]
        return {"tracing": True}
    count = max(1, int(sockets))
    after = tracemalloc.take_snapshot()
    after = after.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    lines = after.compare_to(_traced[0], "lineno")
    files = after.compare_to(_traced[0], "filename")
    return {
        "bytes_per_socket": sum(stat.size_diff for stat in files) / count,
        "by_file": [
            [stat.traceback[0].filename.split("site-packages/")[-1], round(stat.size_diff / count)]
            for stat in files[:25]
        ],
        "by_line": [
            [
                str(stat.traceback[0]).split("site-packages/")[-1],
                round(stat.size_diff / count),
                round(stat.count_diff / count, 2),
            ]
            for stat in lines[:60]
        ],
    }


async def serve(args: argparse.Namespace) -> None:
    clock = GcClock()
    bow = build(
        args.host,
        args.auth_timeout,
        args.max_buffered_bytes,
        args.redis,
        args.namespace,
        args.port,
        gc_freeze=not args.no_gc_freeze,
        history=json.loads(args.history) if args.history else None,
        envelope=args.envelope,
        overrides=json.loads(args.config) if args.config else None,
    )
    await bow.start()
    probe = StallProbe()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    pending = bytearray()

    def stdin_readable() -> None:
        chunk = os.read(sys.stdin.fileno(), 4096)
        if not chunk:
            loop.remove_reader(sys.stdin.fileno())
            stop.set()
            return
        pending.extend(chunk)
        while b"\n" in pending:
            line, _, rest = bytes(pending).partition(b"\n")
            pending[:] = rest
            if line.strip():
                reply = answer(line.decode().strip(), clock, probe, bow)
                print(json.dumps(reply), flush=True)

    loop.add_reader(sys.stdin.fileno(), stdin_readable)

    if args.profile:
        profiler = cProfile.Profile()

        def begin() -> None:
            nonlocal profiler
            profiler = cProfile.Profile()  # a fresh one per phase
            profiler.enable()

        def dump() -> None:
            profiler.disable()
            profiler.dump_stats(args.profile + ".part")
            os.replace(args.profile + ".part", args.profile)

        loop.add_signal_handler(signal.SIGUSR1, begin)
        loop.add_signal_handler(signal.SIGUSR2, dump)

    import bow_gateway

    print(
        json.dumps({"port": bow.port, "pid": os.getpid(), "bow_gateway": bow_gateway.__file__}),
        flush=True,
    )
    await stop.wait()
    await bow.stop()


def raise_open_files_limit() -> None:
    """Raise the soft RLIMIT_NOFILE to the hard limit: 10,000 sockets need 10,000 descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    parser = argparse.ArgumentParser(description="the gateway under benchmark")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--auth-timeout", type=float, default=60.0)
    parser.add_argument("--max-buffered-bytes", type=int, default=1_048_576)
    parser.add_argument("--profile", help="where SIGUSR2 writes the cProfile stats")
    parser.add_argument("--redis", help="a redis:// URL: the Redis backplane instead of memory")
    parser.add_argument("--namespace", default="bow", help="the Redis namespace (with --redis)")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument(
        "--no-gc-freeze", action="store_true", help="gc_freeze off (`serve` turns it on)"
    )
    parser.add_argument("--history", help="the [[history]] rules, as a JSON list of tables")
    parser.add_argument(
        "--config", help="settings as JSON, each top-level table merged into the gateway's"
    )
    parser.add_argument(
        "--envelope", action="store_true", help="the inbound takes envelopes, or lists of them"
    )
    parser.add_argument(
        "--incoming-rate",
        type=float,
        help="packets a second a Socket.IO client may send (the guard's 20: fewer than the "
        "acknowledgements of receipts at saturation)",
    )
    args = parser.parse_args()
    if args.incoming_rate:
        from bow_gateway.seams import transport

        vars(transport)["INCOMING_RATE"] = args.incoming_rate  # read at each new socket
    raise_open_files_limit()
    logging.basicConfig(level=logging.WARNING, format="gateway: %(levelname)s %(message)s")
    if os.environ.get("BENCH_UVLOOP"):
        import uvloop

        uvloop.install()
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
