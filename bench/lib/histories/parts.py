"""A part of ``history_bench.py``: its own ``lib/gateway.py`` on a flushed Redis; py-spy."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from lib import gateway, gateways, machine
from lib.gateways import Gateways
from lib.private_redis import RedisServer


def history_rules(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [{"filter": "chat/#", "max_count": args.max_count, "max_age": 86_400}]


@dataclass
class Part:
    """A gateway of its own for one part, on a flushed Redis."""

    gateways: Gateways
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
        machine.wait_for_quiet(args.quiet)
    namespace = f"hist-{name}"
    line = gateways.command("--namespace", namespace)
    line += ["--redis", redis.url, "--envelope", "--history", json.dumps(history_rules(args))]
    env = dict(os.environ)
    paths = [p for p in (args.pythonpath, args.source) if p]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    process, started = gateways.spawn(line, env, args.source or None)
    port, pid = started["port"], started["pid"]
    gateways.check_source(process, started, args.source, "--gateway's")
    started_gateways = gateways.controllable(
        f"lib/gateway.py pid {pid}", [process], [pid], [f"http://127.0.0.1:{port}"]
    )
    machine.pin_gateway(pid, args.server_cpu)
    print(f"\n== {name}: lib/gateway.py pid {pid} on port {port}, pinned to CPU {args.server_cpu}")
    print(f"   namespace {namespace!r}, history {json.dumps(history_rules(args))}", flush=True)
    return Part(started_gateways, port, pid, namespace)


def parser_of(args: argparse.Namespace) -> str:
    """Whether redis-py finds hiredis where the gateway runs."""
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    code = "from redis.utils import HIREDIS_AVAILABLE as h; print('hiredis' if h else 'Python')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return out.stdout.strip() or out.stderr.strip()[-200:]


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


def replay_file(output: str) -> str:
    """``/tmp/gw.svg`` -> ``/tmp/gw-replay.svg``."""
    stem, dot, extension = output.rpartition(".")
    return f"{stem}-replay.{extension}" if dot and "/" not in extension else output + "-replay"
