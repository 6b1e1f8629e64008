"""Starting the gateways under benchmark: ``lib/gateway.py`` processes, or ``serve --workers``.

``SCRIPT`` is run by path (``python bench/lib/gateway.py``); it prints one JSON line once serving
(``{"port", "pid", "bow_gateway"}``) and takes commands on its stdin (``Gateways.command``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lib import ROOT, gateway
from lib.private_redis import free_port
from lib.proc import children, cmdline

SCRIPT = Path(__file__).resolve().with_name("gateway.py")


def command(*arguments: str) -> list[str]:
    """The command line of a ``lib/gateway.py`` process."""
    return [sys.executable, str(SCRIPT), *arguments]


def spawn(
    line: list[str], env: dict[str, str] | None = None, cwd: str | None = None
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start ``line`` (a ``lib/gateway.py`` command), its stdin and stdout piped; the process
    and the JSON line it printed once serving."""
    process = subprocess.Popen(
        line, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=cwd
    )
    assert process.stdout is not None
    first = process.stdout.readline()
    if not first:
        process.wait(5)
        raise SystemExit(f"the gateway did not start (exit status {process.returncode})")
    started: dict[str, Any] = json.loads(first)
    return process, started


def check_source(
    process: subprocess.Popen[bytes], started: dict[str, Any], source: str | None, whose: str
) -> None:
    """Stop if the gateway did not import bow_gateway from ``source`` (a PYTHONPATH entry)."""
    if source and not started.get("bow_gateway", "").startswith(source):
        process.kill()
        raise SystemExit(f"the gateway imported {started.get('bow_gateway')}, not {whose}")


@dataclass
class Gateways:
    """The instance(s) under test, as the load generator sees them."""

    description: str
    processes: list[subprocess.Popen[bytes]]
    pids: list[int]  # the processes that serve (CPU and RSS are read from these)
    socket_urls: list[str]  # where clients connect (spread over them)
    post_urls: list[str]  # where messages are POSTed (alternated)
    version: str
    secret: str
    user: str
    password: str
    profile: str | None = None  # lib/gateway.py instances write cProfile stats to <this>.<k>
    controllable: bool = False  # lib/gateway.py instances take commands on stdin (gc, freeze...)

    async def command(self, text: str) -> list[dict[str, Any]]:
        """Send a command line to every lib/gateway.py instance; their JSON answers ([] if none)."""
        if not self.controllable:
            return []
        loop = asyncio.get_running_loop()
        answers = []
        for process in self.processes:
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(text.encode() + b"\n")
            process.stdin.flush()
            line = await loop.run_in_executor(None, process.stdout.readline)
            answers.append(json.loads(line))
        return answers

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def controllable(
    description: str, processes: list[subprocess.Popen[bytes]], pids: list[int], urls: list[str]
) -> Gateways:
    """``lib/gateway.py`` instances, serving ``urls``, that take commands."""
    return Gateways(
        description=description,
        processes=processes,
        pids=pids,
        socket_urls=urls,
        post_urls=[url + gateway.PATH for url in urls],
        version=gateway.OUTBOUND_VERSION,
        secret=gateway.SECRET,
        user=gateway.USER,
        password=gateway.PASSWORD,
        controllable=True,
    )


def start_bench_gateway(
    redis_url: str | None, namespace: str, profile: str | None = None
) -> tuple[subprocess.Popen[bytes], int, int]:
    line = command("--namespace", namespace)
    if redis_url:
        line += ["--redis", redis_url]
    if profile:
        line += ["--profile", profile]
    process, started = spawn(line)
    return process, started["port"], started["pid"]


def start_pinned(
    profile: str | None, pin: bool, server_cpu: int
) -> tuple[subprocess.Popen[bytes], int, int]:
    """One ``lib/gateway.py`` (in-process backplane), pinned to ``server_cpu`` with ``taskset``
    if ``pin``; (process, port, pid)."""
    line = command()
    if profile:
        line += ["--profile", profile]
    if pin and shutil.which("taskset"):
        line = ["taskset", "-c", str(server_cpu), *line]
    process, started = spawn(line)
    return process, started["port"], started["pid"]


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_serve_workers(count: int, redis_url: str, namespace: str) -> Gateways:
    """``python -m bow_gateway serve --workers N`` on the embedded default, through Redis."""
    port = free_port()
    env = {
        **os.environ,
        "BOW_REDIS_URL": redis_url,
        "BOW_NAMESPACE": namespace,
        "BOW_JWT_SECRET": gateway.SECRET,
        "BOW_INBOUND_PASSWORD": gateway.PASSWORD,
        "BOW_OUTBOUND_TIMEOUT": "60",
        "BOW_LOG_INTERVAL": "0",
    }
    env.pop("BOW_CONFIG", None)
    line = [sys.executable, "-m", "bow_gateway", "serve", "--workers", str(count)]
    line += ["--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(
        line,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_for_workers(process, count)
    workers = [p for p in children(process.pid) if "spawn_main" in cmdline(p)]
    if len(workers) != count:
        process.kill()
        raise SystemExit(f"expected {count} worker processes, found {workers}")
    url = f"http://127.0.0.1:{port}"
    return Gateways(
        description=f"`serve --workers {count}` (port {port} shared, SO_REUSEPORT), "
        f"worker pids {workers}",
        processes=[process],
        pids=workers,
        socket_urls=[url],
        post_urls=[url + "/v1/messages"],
        version="v1",
        secret=gateway.SECRET,
        user="pusher",
        password=gateway.PASSWORD,
    )


def wait_for_workers(process: subprocess.Popen[bytes], count: int) -> None:
    """Until ``count`` workers say "serving on" on stderr (read to its end by a thread, so that
    the workers never block on it; warnings and errors printed)."""
    serving = threading.Semaphore(0)
    tail: list[str] = []

    def drain() -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            line = raw.decode(errors="replace").rstrip()
            tail.append(line)
            del tail[:-50]
            if "serving on" in line:
                serving.release()
            elif " WARNING " in line or " ERROR " in line:
                print(f"  serve: {line}", flush=True)

    threading.Thread(target=drain, daemon=True).start()
    for _ in range(count):
        if not serving.acquire(timeout=30):
            process.kill()
            raise SystemExit("serve --workers did not start:\n" + "\n".join(tail))
