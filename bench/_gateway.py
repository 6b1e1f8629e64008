"""The gateway that ``delivery_bench.py`` starts in a process of its own.

The quick-start gateway (as ``tests/support.standard_bow`` builds it): the bundled JWT outbound
v1.3, the claims middleware v1.1 and the pass-through inbound on ``/v1.2/messages``, one instance
with the in-process backplane. Once serving, it prints one JSON line on stdout
(``{"port": ..., "pid": ...}``), then runs until SIGTERM, SIGINT or the end of its stdin (so it
never outlives the benchmark). SIGUSR1 starts cProfile, SIGUSR2 stops it and writes the stats to
the file given with ``--profile``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import os
import signal
import sys

from bow_gateway.inbounds.passthrough import create_message_from_request_body
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.outbounds.jwt import JwtOutbound

from bow_gateway import Bow

SECRET = "a-benchmark-secret-that-is-at-least-32-bytes-long"
USER, PASSWORD, REALM = "pusher", "bench-pusher", "Benchmark"
PATH = "/v1.2/messages"
OUTBOUND_VERSION = "v1.3"


def build(host: str, auth_timeout: float, max_queued_frames: int) -> Bow:
    config = {
        "port": 0,
        "host": host,
        "inbound": {"realm": REALM, "username": USER, "password": PASSWORD},
        "outbound": {"timeout": auth_timeout, "max_queued_frames": max_queued_frames},
        "middleware": {"log_interval": None},
    }
    return (
        Bow(config)
        .middleware(version="v1.1", create_criteria_from_listener_details=criteria_from_claim())
        .inbound(
            path=PATH,
            create_message_from_request_body=create_message_from_request_body,
            middleware_version="v1.1",
        )
        .outbound(
            version=OUTBOUND_VERSION,
            create_listener_details_from_token=JwtOutbound(secret=SECRET),
            middleware_version="v1.1",
        )
    )


async def serve(args: argparse.Namespace) -> None:
    bow = build(args.host, args.auth_timeout, args.max_queued_frames)
    await bow.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    def stdin_readable() -> None:
        if not os.read(sys.stdin.fileno(), 4096):
            loop.remove_reader(sys.stdin.fileno())
            stop.set()

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

    print(json.dumps({"port": bow.port, "pid": os.getpid()}), flush=True)
    await stop.wait()
    await bow.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="the gateway under benchmark")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--auth-timeout", type=float, default=60.0)
    parser.add_argument("--max-queued-frames", type=int, default=1_000)
    parser.add_argument("--profile", help="where SIGUSR2 writes the cProfile stats")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="gateway: %(levelname)s %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
