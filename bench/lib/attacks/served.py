"""The gateway of ``attack_bench.py``: ``bow-gateway serve --config`` with a file of its own."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from lib import gateway, proc
from lib.attacks import INBOUND, NOBODY, VERSION
from lib.private_redis import free_port
from lib.variants import package_layout


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
        return proc.rss_kib(self.pid)["VmRSS"]

    def reset_peak(self) -> bool:
        """Reset VmHWM to the current RSS (Linux 4.0+); False if not allowed."""
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w", encoding="ascii") as clear_refs:
                clear_refs.write("5")
            return True
        except OSError:
            return False

    def peak_kib(self) -> int:
        return proc.rss_kib(self.pid)["VmHWM"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


PASSTHROUGH = "bow_gateway.inbounds.passthrough:create_message_from_request_body"
CONFIG = f"""\
# attack_bench.py's gateway: the embedded default (bow_gateway/app/standalone.py's
# embedded_default), plus anonymous listeners, client publishes and /chat/ histories of 10,000
# (issue 27's attacks).
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
        before = proc.cpu_seconds(pid)
        await asyncio.sleep(span)
        if proc.cpu_seconds(pid) - before < busy * span:
            break
    return time.monotonic() - started
