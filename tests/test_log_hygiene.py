"""No credential ever reaches a log line: ``bow-gateway serve`` as a real process, every malformed
request we could think of carrying the inbound password or a token, then a grep of all it wrote."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import socketio
from bow_gateway.outbounds.jwt import mint

from .support import SECRET
from .support.served import BOW_GATEWAY, free_port, send_raw

PASSWORD = "pw-Q7x9-never-log-me-4f2b"
USER = "pusher"
CREDENTIALS = base64.b64encode(f"{USER}:{PASSWORD}".encode())
JWT = mint("USER/1", SECRET, criteria={"role": "admin"})
BAD_JWT = mint("USER/2", SECRET + "-but-not-quite", criteria={})
INBOUND = "/v1/messages"


@dataclass
class Served:
    port: int
    process: subprocess.Popen[bytes]
    out: Path
    err: Path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """``bow-gateway serve`` on the embedded default, with its secrets from the environment."""
    port = free_port()
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    env = {"PATH": "/usr/bin:/bin", "BOW_INBOUND_PASSWORD": PASSWORD, "BOW_JWT_SECRET": SECRET}
    with (
        open(out, "wb") as stdout,
        open(err, "wb") as stderr,
        subprocess.Popen(
            [*BOW_GATEWAY, "serve", "--port", str(port)],
            stdout=stdout,
            stderr=stderr,
            env=env,
        ) as process,
    ):
        try:
            deadline = time.monotonic() + 15
            while True:
                assert process.poll() is None, err.read_text()
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                        break
                except (urllib.error.URLError, OSError):
                    assert time.monotonic() < deadline, "serve never answered /health"
                    time.sleep(0.1)
            yield Served(port, process, out, err)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(10)


def request(head: bytes, body: bytes = b"") -> bytes:
    return head + b"\r\n\r\n" + body


def attacks() -> dict[str, bytes]:
    """Raw requests, each malformed somewhere, each carrying a credential."""
    auth = b"Authorization: Basic " + CREDENTIALS
    post = f"POST {INBOUND} HTTP/1.1\r\nHost: gateway".encode()
    json_post = post + b"\r\n" + auth + b"\r\nContent-Type: application/json"
    poll = f"/socket.io/?EIO=4&transport=polling&v=v1&token={JWT}".encode()
    attacks = {
        "control byte": post + b"\r\n" + auth + b"\x01\r\nContent-Length: 0",
        "NUL": post + b"\r\n" + auth + b"\x00tail",
        "DEL": post + b"\r\n" + auth + b"\x7f",
        "escape": post + b"\r\n" + auth + b"\x1b[2J",
        "non-UTF-8 value": post + b"\r\n" + auth + b"\xff\xfe",
        "non-UTF-8 name": post + b"\r\nAuthoriz\xe9tion: Basic " + CREDENTIALS,
        "folded header": post + b"\r\nAuthorization: Basic\r\n " + CREDENTIALS,
        "folded with tab": post + b"\r\nAuthorization:\r\n\tBasic " + CREDENTIALS,
        "overlong header line": post + b"\r\n" + auth + b"A" * 9000,
        "overlong header name": post + b"\r\n" + b"X" * 9000 + b": " + CREDENTIALS,
        "too many headers": post + b"\r\n" + b"\r\n".join([auth] * 200),
        "space before colon": post + b"\r\nAuthorization : Basic " + CREDENTIALS,
        "no colon": post + b"\r\nAuthorization Basic " + CREDENTIALS,
        "bare LF": post.replace(b"\r\n", b"\n") + b"\n" + auth + b"\x01",
        "bare CR": post + b"\r" + auth + b"\r",
        "two Authorization": post + b"\r\n" + auth + b"\r\n" + auth + b"\x02",
        "raw password": post + b"\r\nAuthorization: Basic " + f"{USER}:{PASSWORD}".encode(),
        "raw password, control byte": post
        + b"\r\nAuthorization: Basic "
        + f"{USER}:{PASSWORD}\x01".encode(),
        "bad base64": post + b"\r\n" + auth + b"!!==",
        "URL with credentials": b"POST http://"
        + f"{USER}:{PASSWORD}".encode()
        + b"@gateway"
        + INBOUND.encode()
        + b" HTTP/1.1\r\nHost: gateway\r\nContent-Length: 0",
        "credentials in the query, control byte": b"POST "
        + INBOUND.encode()
        + b"?auth="
        + CREDENTIALS
        + b"\x01 HTTP/1.1\r\nHost: gateway",
        "bad method": b"P\x00ST " + INBOUND.encode() + b" HTTP/1.1\r\n" + auth,
        "bad version": f"POST {INBOUND} HTTP/9.9\r\n".encode() + auth,
        "bad request line": b"POST  " + CREDENTIALS + b"\r\n" + auth,
        "bad Content-Length": json_post + b"\r\nContent-Length: 1x",
        "Content-Length and chunked": json_post
        + b"\r\nContent-Length: 4\r\nTransfer-Encoding: chunked",
        "JWT in the query, control byte": b"GET " + poll + b"\x01 HTTP/1.1\r\nHost: gateway",
        "JWT in the query": b"GET " + poll + b" HTTP/1.1\r\nHost: gateway",
        "JWT in a header, control byte": b"GET /socket.io/?EIO=4&transport=polling&v=v1 "
        + b"HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer "
        + JWT.encode()
        + b"\x01",
        "JWT as a cookie, NUL": b"GET /health HTTP/1.1\r\nHost: gateway\r\nCookie: token="
        + JWT.encode()
        + b"\x00",
    }
    requests = {name: request(head) for name, head in attacks.items()}
    bodies = {
        "bad chunk size": (json_post + b"\r\nTransfer-Encoding: chunked", b"zz\r\n{}\r\n0\r\n\r\n"),
        "garbage gzip": (
            json_post + b"\r\nContent-Encoding: gzip\r\nContent-Length: 9",
            b"not gzip!",
        ),
        "bad JSON": (json_post + b"\r\nContent-Length: 9", b"{not json"),
        "not UTF-8 JSON": (json_post + b"\r\nContent-Length: 3", b"\xff\xfe{"),
        "invalid message": (json_post + b"\r\nContent-Length: 28", b'{"name": "", "audience": {}}'),
        "form": (post + b"\r\n" + auth + b"\r\nContent-Length: 6", b"a=b&c="),
        "body too short": (json_post + b"\r\nContent-Length: 50", b"{"),
    }
    requests.update({name: request(head, body) for name, (head, body) in bodies.items()})
    return requests


async def authenticate(url: str, token: str) -> bool:
    """A real listener authenticating with ``token``, then leaving; False if it was refused."""
    client = socketio.AsyncClient(reconnection=False)
    try:
        await client.connect(f"{url}?v=v1", transports=["websocket"], wait_timeout=5)
        try:
            await client.call("authenticate", token, timeout=2)
        except socketio.exceptions.TimeoutError:
            return False  # a refused token gets an alert, never an acknowledgement
        return True
    finally:
        await client.disconnect()


def secrets() -> dict[str, str]:
    """Each credential, and a 12-character window of each (a truncated quote is a leak too)."""
    whole = {
        "password": PASSWORD,
        "Basic credentials": CREDENTIALS.decode(),
        "JWT": JWT,
        "refused JWT": BAD_JWT,
        "JWT secret": SECRET,
    }
    found = dict(whole)
    for name, value in whole.items():
        for start in range(0, len(value) - 12, 4):
            found[f"{name}[{start}:]"] = value[start : start + 12]
    return found


async def test_no_credential_reaches_any_line_the_gateway_writes(served: Served) -> None:
    await asyncio.gather(*(send_raw(served.port, data) for data in attacks().values()))
    url = f"http://127.0.0.1:{served.port}"
    assert await authenticate(url, JWT)
    assert not await authenticate(url, BAD_JWT)
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(10) == 0
    written = served.out.read_text(errors="replace") + served.err.read_text(errors="replace")
    lines = written.splitlines()
    for line in lines:
        json_escaped = json.dumps(line)  # a log collector sees the JSON line as text too
        for name, value in secrets().items():
            assert value not in line and value not in json_escaped, f"{name} in {line[:300]!r}"
    # The attacks did reach the code paths that log: parse errors and refusals.
    assert sum("malformed request" in line for line in lines) >= 20
    assert any("refused POST" in line for line in lines)


async def test_serve_warns_when_a_config_file_keeps_the_documented_password(
    tmp_path: Path,
) -> None:
    example = Path(__file__).resolve().parent.parent / "deploy" / "gateway.example.toml"
    env = {"PATH": "/usr/bin:/bin", "BOW_JWT_SECRET": SECRET, "BOW_PORT": str(free_port())}
    process = await asyncio.create_subprocess_exec(
        *BOW_GATEWAY,
        "serve",
        "--config",
        str(example),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert process.stderr is not None
    lines = []
    try:
        async with asyncio.timeout(15):
            while not lines or "serving on" not in lines[-1]:
                line = (await process.stderr.readline()).decode()
                assert line, "serve ended:\n" + "".join(lines)
                lines.append(line)
    finally:
        process.send_signal(signal.SIGTERM)
        await process.communicate()
    warnings = [json.loads(line) for line in lines if '"level": "warning"' in line]
    assert any("inbound.password" in warning["message"] for warning in warnings), lines
    assert not any("change-me" in line for line in lines)
