"""Gateway memory per idle authenticated socket, with the official socket.io-client (Node.js).

Run:  (cd bench/node && npm ci)     # once: socket.io-client 4.x
      .venv/bin/python bench/node_memory_bench.py [--sockets 1000,10000]
          [--transports websocket,polling+websocket] [--concurrency 100]

A plain script, not a test. For each number of sockets and each transport choice it starts a
fresh ``lib/gateway.py`` (pinned to CPU 0 with ``taskset`` when it can), reads its RSS, opens that
many official ``socket.io-client`` connections from one Node process (``bench/node/
idle_clients.mjs``: ``transports: ["websocket"]``, or the client's default, long-polling first
then the upgrade, written ``polling+websocket``), each authenticated with its own JWT, waits 3
seconds, and reads the gateway's RSS again: the growth divided by the sockets is the memory an
idle authenticated socket costs. It also gives the connect+authenticate rate, the gateway's CPU
per connection, and the sockets that failed to authenticate (the node client offers
permessage-deflate, which the gateway declines).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from lib import BENCH, machine, proc, stats
from lib.gateway import OUTBOUND_VERSION, SECRET
from lib.gateways import start_pinned, stop_process
from lib.listeners import mint

NODE = BENCH / "node"


def measure(
    sockets: int, transports: str, concurrency: int, pin: bool, trace: str | None = None
) -> list[str]:
    gateway, port, pid = start_pinned(None, pin, 0)
    try:
        time.sleep(1)
        if trace:
            ask(gateway, "trace")
        before = proc.rss_kib(pid)["VmRSS"]
        cpu_before = proc.cpu_seconds(pid)
        with tempfile.NamedTemporaryFile("w", suffix=".tokens") as tokens:
            for i in range(sockets):
                tokens.write(mint(f"node-{i}", SECRET, {"all": True}) + "\n")
            tokens.flush()
            node = subprocess.Popen(
                [
                    "node",
                    str(NODE / "idle_clients.mjs"),
                    f"http://127.0.0.1:{port}",
                    OUTBOUND_VERSION,
                    transports.replace("+", ","),
                    str(concurrency),
                    tokens.name,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=NODE,
            )
            assert node.stdout is not None and node.stdin is not None
            line = node.stdout.readline()
            if not line:
                raise SystemExit("the node clients failed (did you run `npm ci` in bench/node?)")
            done = json.loads(line)
            cpu = proc.cpu_seconds(pid) - cpu_before
            time.sleep(3)
            after = proc.rss_kib(pid)
            if trace:
                traced = ask(gateway, f"trace {done['authenticated']}")
                where = Path(f"{trace}-{sockets}-{transports}.json")
                where.write_text(json.dumps(traced, indent=1))
            node.stdin.close()
            node.wait(30)
    finally:
        stop_process(gateway)
    per_socket = (after["VmRSS"] - before) / max(1, done["authenticated"])
    return [
        f"{sockets:,}",
        transports,
        f"{done['authenticated']:,}",
        f"{done['failed']:,}",
        f"{done['authenticated'] / done['seconds']:,.0f}/s",
        f"{cpu / max(1, done['authenticated']) * 1000:.2f}",
        f"{before / 1024:.0f} -> {after['VmRSS'] / 1024:.0f} MiB",
        f"{per_socket:.1f} KiB",
    ]


def ask(gateway: subprocess.Popen[bytes], command: str) -> dict[str, object]:
    """One command to ``lib/gateway.py`` on its stdin, and its answer."""
    assert gateway.stdin is not None and gateway.stdout is not None
    gateway.stdin.write(command.encode() + b"\n")
    gateway.stdin.flush()
    answer: dict[str, object] = json.loads(gateway.stdout.readline())
    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sockets", default="1000,10000")
    parser.add_argument("--transports", default="websocket,polling+websocket")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument(
        "--trace",
        metavar="PREFIX",
        help="also trace the gateway's allocations (tracemalloc: slower, and its own memory in "
        "the RSS) and write what each socket holds, by file and line, to PREFIX-N-T.json",
    )
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # node inherits it
    pin = not args.no_pin and shutil.which("taskset") is not None and (os.cpu_count() or 1) > 1
    node_version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout
    client = json.loads((NODE / "node_modules/socket.io-client/package.json").read_text())
    print(machine.environment(["aiohttp", "python-socketio", "python-engineio"]))
    print(
        f"node {node_version.strip()}, socket.io-client {client['version']}; gateway pinned: {pin}"
    )
    rows = []
    for sockets in (int(n) for n in args.sockets.split(",")):
        for transports in args.transports.split(","):
            rows.append(measure(sockets, transports, args.concurrency, pin, args.trace))
            print(f"  {rows[-1]}", flush=True)
    print()
    print(
        stats.table(
            [
                "sockets",
                "transports",
                "authenticated",
                "failed",
                "connect+auth",
                "gateway ms/conn",
                "gateway RSS",
                "RSS per socket",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
