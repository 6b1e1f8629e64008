"""Running one attack: its spec from the options, a child process for it, and what it said."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from lib import BENCH
from lib.attacks.flywheel import (
    attack_flywheel_flood,
    attack_flywheel_publish,
    attack_replay,
)
from lib.attacks.inbound import (
    attack_auth_brute,
    attack_queries,
    attack_recovery,
    attack_sse_slow,
)
from lib.attacks.served import Gateway
from lib.attacks.sockets import attack_binary, attack_filters, attack_frames, attack_holders
from lib.attacks.wire import gateway_token
from lib.machine import raise_open_files_limit

SCRIPT = BENCH / "attack_bench.py"  # run with --attacker KIND --spec JSON in each child


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
        str(SCRIPT),
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
