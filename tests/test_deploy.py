"""deploy/nginx/bow-gateway.conf, run for real: nginx in front of two gateways sharing one Redis.

The nginx configuration is the repository's own file, verbatim except for the upstream's
``server`` lines and the ``listen`` line (see :func:`render`), wrapped in a minimal nginx.conf
that keeps everything nginx writes in a temporary directory. nginx comes from Debian
(``tests/install-system-packages.sh`` installs it), the gateways are ``bow-gateway serve``
subprocesses, and the listeners are real python-socketio clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from .support import SECRET, Listener, token
from .support.redis_server import RedisServer
from .support.served import BOW_GATEWAY, clean_env, free_port, wait_for_health

REPOSITORY = Path(__file__).resolve().parent.parent
NGINX_CONF = REPOSITORY / "deploy" / "nginx" / "bow-gateway.conf"
PASSWORD = "a-deploy-test-password"
AUTH = {"Authorization": aiohttp.encode_basic_auth("pusher", PASSWORD)}
INSTALL_HINT = "run tests/install-system-packages.sh (as root) to install it"

# An upstream server line (`server HOST:PORT [parameters];`) and the listen line.
UPSTREAM_SERVER = re.compile(
    r"^(?P<indent>[ \t]*)server[ \t]+[^\s;]+(?P<params>[^;\n]*);[^\n]*\n", re.M
)
UPSTREAM_BLOCK = re.compile(r"^upstream[ \t]+bow_gateway[ \t]*\{\n(?P<body>.*?)^\}", re.M | re.S)
LISTEN = re.compile(r"^(?P<indent>[ \t]*)listen[ \t]+[^;]+;", re.M)


def render(conf: str, upstreams: list[str], listen: str) -> str:
    """deploy/nginx/bow-gateway.conf with its upstream servers and listen address swapped.

    Fails loudly if the file no longer has the shape this relies on (one ``bow_gateway``
    upstream with ``server`` lines, one ``listen`` line), rather than testing something else.
    """
    blocks = list(UPSTREAM_BLOCK.finditer(conf))
    assert len(blocks) == 1, "expected one `upstream bow_gateway { ... }` block at column 0"
    block = blocks[0]
    body = block["body"]
    servers = list(UPSTREAM_SERVER.finditer(body))
    assert servers, "the bow_gateway upstream has no `server` line"
    first = servers[0]
    lines = "".join(
        f"{first['indent']}server {address}{first['params']};\n" for address in upstreams
    )
    new_body = body[: first.start()] + lines + UPSTREAM_SERVER.sub("", body[first.end() :])
    conf = conf[: block.start("body")] + new_body + conf[block.end("body") :]
    conf, count = LISTEN.subn(rf"\g<indent>listen {listen};", conf)
    assert count == 1, f"expected one `listen` line, found {count}"
    return conf


def nginx_binary() -> str:
    # /usr/sbin is not on a non-root user's PATH on Debian.
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        pytest.fail(f"nginx is not installed: {INSTALL_HINT}")
    return found


@dataclass
class Nginx:
    """A private nginx: its prefix directory, main config and port (not started)."""

    prefix: Path
    port: int
    upstreams: list[str]

    @property
    def conf(self) -> Path:
        return self.prefix / "nginx.conf"

    @property
    def error_log(self) -> Path:
        return self.prefix / "error.log"

    @property
    def access_log(self) -> Path:
        return self.prefix / "access.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write(self) -> None:
        site = render(NGINX_CONF.read_text(), self.upstreams, f"127.0.0.1:{self.port}")
        (self.prefix / "bow-gateway.conf").write_text(site)
        # Started as root, nginx runs its workers as `user` (nobody by default), who cannot
        # enter pytest's 0700 temporary directory: keep them root. Not started as root, nginx
        # warns that the directive makes no sense, so it is written only then.
        user = ""
        if os.geteuid() == 0:
            user = (
                f"user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};"
            )
        temp = "\n".join(
            f"    {kind}_temp_path {self.prefix / kind};"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        self.conf.write_text(
            f"""{user}
worker_processes 1;
error_log {self.error_log} info;
events {{
    worker_connections 256;
}}
http {{
    log_format upstream '$request_method $uri $status $upstream_addr';
    access_log {self.access_log} upstream;
{temp}
    include {self.prefix / "bow-gateway.conf"};
}}
"""
        )

    def argv(self, *extra: str) -> list[str]:
        # -e: the log of nginx's own start, before it reads error_log (the default is
        # /var/log/nginx/error.log, which only root may open).
        return [
            nginx_binary(),
            "-p", f"{self.prefix}/",
            "-c", str(self.conf),
            "-e", str(self.error_log),
            "-g", f"daemon off; pid {self.prefix / 'nginx.pid'};",
            *extra,
        ]  # fmt: skip

    def requests(self, path: str) -> list[tuple[str, str]]:
        """(status, gateway address) of each request for ``path`` so far, from the access log."""
        found = []
        for line in self.access_log.read_text().splitlines():
            _, uri, status, upstream = line.split(" ", 3)
            if uri == path:
                found.append((status, upstream))
        return found


@dataclass
class Stack:
    nginx: Nginx
    gateways: list[str]


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} never answered 200:\n{log.read_text()}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Redis, two ``bow-gateway serve`` instances on it, and nginx in front, for the module."""
    directory = tmp_path_factory.mktemp("deploy")
    nginx_binary()
    # Stopped in reverse: nginx, the gateways, then Redis.
    with RedisServer() as redis, contextlib.ExitStack() as cleanup:
        ports = [free_port(), free_port()]
        env = clean_env(
            BOW_REDIS_URL=redis.url,
            BOW_HOST="127.0.0.1",
            BOW_INBOUND_PASSWORD=PASSWORD,
            BOW_JWT_SECRET=SECRET,
        )
        gateways = []
        for number, port in enumerate(ports, 1):
            log = directory / f"gateway-{number}.log"
            output = cleanup.enter_context(open(log, "wb"))
            process = subprocess.Popen(
                [*BOW_GATEWAY, "serve", "--port", str(port)],
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
            )
            cleanup.callback(stop, process)
            gateways.append((f"http://127.0.0.1:{port}", process))
        for url, process in gateways:
            wait_for_health(url, process)

        nginx = Nginx(directory, free_port(), [f"127.0.0.1:{port}" for port in ports])
        nginx.write()
        process = subprocess.Popen(
            nginx.argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        cleanup.callback(stop, process)  # SIGTERM: at once (SIGQUIT would wait for sockets)
        wait_for(nginx.url + "/health", process, nginx.error_log)
        yield Stack(nginx, [url for url, _ in gateways])


def test_nginx_accepts_the_rendered_config(tmp_path: Path) -> None:
    nginx = Nginx(tmp_path, free_port(), ["127.0.0.1:18080", "127.0.0.1:18081"])
    nginx.write()
    checked = subprocess.run(nginx.argv("-t"), capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    assert "syntax is ok" in checked.stderr
    assert "test is successful" in checked.stderr
    rendered = (tmp_path / "bow-gateway.conf").read_text()
    assert "server 127.0.0.1:18080 max_fails" in rendered
    assert "server 127.0.0.1:18081 max_fails" in rendered
    assert "gateway-1" not in rendered and "gateway-2" not in rendered
    # Everything else is the repository's file, line for line.
    kept = [line for line in rendered.splitlines() if "127.0.0.1:" not in line]
    original = [
        line
        for line in NGINX_CONF.read_text().splitlines()
        if not re.match(r"\s*(server\s+gateway-\d|listen\s)", line)
    ]
    assert kept == original


async def push(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    async with session.post(url + "/v1/messages", json=body, headers=AUTH) as response:
        assert response.status == 204, await response.text()


async def receive_from_everywhere(stack: Stack, listener: Listener, name: str) -> None:
    """A message POSTed through nginx, then one POSTed to each gateway directly, all arrive."""
    async with aiohttp.ClientSession() as session:
        for number, url in enumerate([stack.nginx.url, *stack.gateways]):
            body = {"name": name, "audience": [{"__id": name}], "n": number}
            await push(session, url, body)
            assert await listener.next_event() == (name, body)


def disconnect(listener_id: str) -> dict[str, Any]:
    return {"name": "__disconnect", "audience": [{"__id": listener_id}]}


async def test_a_websocket_through_nginx_receives_messages(stack: Stack) -> None:
    listener = Listener(stack.nginx.url)
    try:
        await listener.connect("v1", transports=["websocket"])
        assert listener.client.transport() == "websocket"
        assert await listener.authenticate(token("websocket-listener")) is None
        await receive_from_everywhere(stack, listener, "websocket-listener")
    finally:
        await listener.close()
    # nginx upgraded the connection (it logs a WebSocket when it closes).
    async with asyncio.timeout(5):
        while "101" not in [status for status, _ in stack.nginx.requests("/socket.io/")]:
            await asyncio.sleep(0.05)


async def test_long_polling_through_nginx_sticks_to_one_gateway(stack: Stack) -> None:
    listener = Listener(stack.nginx.url)
    try:
        await listener.connect("v1", transports=["polling"])
        assert listener.client.transport() == "polling"
        assert await listener.authenticate(token("polling-listener")) is None
        await receive_from_everywhere(stack, listener, "polling-listener")
        # End the session from the server: python-engineio's polling client that disconnects
        # itself waits for its pending long-poll, which is answered only at the next ping (25 s).
        async with aiohttp.ClientSession() as session:
            await push(session, stack.nginx.url, disconnect("polling-listener"))
        await asyncio.wait_for(listener.disconnected.wait(), 5)
    finally:
        await listener.close()
    # Every request of the session (handshake, polls, posts) went to one gateway: ip_hash.
    used = [upstream for status, upstream in stack.nginx.requests("/socket.io/") if status == "200"]
    assert len(used) >= 4, used
    assert len(set(used)) == 1, used
    assert used[0] in stack.nginx.upstreams


async def test_health_metrics_and_refusals_pass_through(stack: Stack) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(stack.nginx.url + "/health") as response:
            assert response.status == 200
            assert await response.read() == b""
        # /metrics is open to 127.0.0.1 and answers what the gateway answers.
        async with session.get(stack.gateways[0] + "/metrics") as direct:
            expected = direct.status
        async with session.get(stack.nginx.url + "/metrics") as response:
            assert response.status == expected
        # The gateway's own refusals reach the caller unchanged.
        async with session.post(stack.nginx.url + "/v1/messages", json={}) as response:
            assert response.status == 401
            assert response.headers["WWW-Authenticate"] == 'Basic realm="bow-gateway"'
        async with session.post(
            stack.nginx.url + "/v1/messages", json={}, headers=AUTH
        ) as response:
            assert response.status == 422


def test_the_image_healthcheck_asks_health(stack: Stack) -> None:
    """deploy/Dockerfile's HEALTHCHECK command, run here: 0 when /health says 200, else not."""
    dockerfile = (REPOSITORY / "deploy" / "Dockerfile").read_text()
    found = re.search(r"^HEALTHCHECK [^\n]*\\\n\s*CMD (\[.*\])$", dockerfile, re.M)
    assert found, "no HEALTHCHECK ... CMD [...] in deploy/Dockerfile"
    program, *args = json.loads(found[1])
    assert program == "python"

    def healthcheck(port: str) -> int:
        env = clean_env(BOW_PORT=port)
        return subprocess.run(
            [sys.executable, *args], env=env, capture_output=True, timeout=10
        ).returncode

    assert healthcheck(stack.gateways[0].rsplit(":", 1)[1]) == 0
    assert healthcheck(str(free_port())) != 0  # nothing listens there
