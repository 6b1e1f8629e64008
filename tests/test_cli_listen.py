"""``bow-gateway listen`` as a real process against a real ``serve``: whatever ends the session (a
``__disconnect`` message, a refused token or version, Ctrl-C, the gateway stopping), it closes its
HTTP session (no ``Unclosed client session``) and says why in words, never as a Python dict."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .served import PYTHON, Served, clean_env, serve
from .support import SECRET

Pipe = asyncio.subprocess.PIPE
BASIC = "Basic " + base64.b64encode(b"pusher:change-me").decode()  # the embedded default's


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(tmp_path_factory.mktemp("serve"), BOW_JWT_SECRET=SECRET) as served:
        yield served


@dataclass
class Ended:
    code: int
    out: str
    err: str


class Listening:
    """``bow-gateway listen`` under way: read stderr up to a line, signal it, collect it."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.err = ""

    @classmethod
    async def start(cls, *args: str) -> Listening:
        process = await asyncio.create_subprocess_exec(
            *PYTHON, "listen", *args, stdout=Pipe, stderr=Pipe, env=clean_env(BOW_JWT_SECRET=SECRET)
        )
        return cls(process)

    async def until(self, start: str, timeout: float = 15) -> None:
        """Read stderr until a line starts with ``start``."""
        assert self.process.stderr is not None
        async with asyncio.timeout(timeout):
            while True:
                line = (await self.process.stderr.readline()).decode()
                self.err += line
                assert line, f"listen ended before {start!r}:\n{self.err}"
                if line.startswith(start):
                    return

    async def end(self, timeout: float = 15) -> Ended:
        out, err = await asyncio.wait_for(self.process.communicate(), timeout)
        assert self.process.returncode is not None
        return Ended(self.process.returncode, out.decode(), self.err + err.decode())


async def listen(*args: str) -> Ended:
    return await (await Listening.start(*args)).end()


def push(served: Served, name: str, audience: list[dict[str, object]]) -> None:
    request = urllib.request.Request(
        served.url + "/v1/messages",
        data=json.dumps({"name": name, "audience": audience}).encode(),
        headers={"Content-Type": "application/json", "Authorization": BASIC},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 204


def assert_closed_cleanly(ended: Ended) -> None:
    assert "Unclosed" not in ended.err, ended.err
    assert "Traceback" not in ended.err, ended.err


async def test_a_disconnect_message_ends_it_cleanly(gateway: Served) -> None:
    listening = await Listening.start("--url", gateway.url, "--id", "USER/41")
    await listening.until("listening on")
    push(gateway, "__disconnect", [{"__id": "USER/41"}])
    ended = await listening.end()
    assert ended.code == 1
    assert "bow-gateway listen: disconnected by the server" in ended.err
    assert_closed_cleanly(ended)


async def test_a_refused_token_ends_it_cleanly(gateway: Served) -> None:
    ended = await listen("--url", gateway.url, "--token", "not-a-token")
    assert ended.code == 1
    assert "bow-gateway listen: authentication refused: auth_refused: the token was refused" in ended.err
    assert_closed_cleanly(ended)


async def test_an_unknown_version_is_said_in_words(gateway: Served) -> None:
    ended = await listen("--url", gateway.url, "--version", "v2", "--id", "USER/42")
    assert ended.code == 1
    assert ended.err.strip().splitlines()[-1] == (
        f"bow-gateway listen: {gateway.url}?v=v2 refused the connection: "
        "unknown outbound version 'v2': this gateway serves v1"
    )
    assert "{" not in ended.err, ended.err
    assert_closed_cleanly(ended)


async def test_ctrl_c_ends_it_cleanly(gateway: Served) -> None:
    listening = await Listening.start("--url", gateway.url, "--id", "USER/43")
    await listening.until("listening on")
    listening.process.send_signal(signal.SIGINT)
    ended = await listening.end()
    assert ended.code == 0
    assert_closed_cleanly(ended)


async def test_the_gateway_stopping_ends_it_cleanly(tmp_path: Path) -> None:
    with serve(tmp_path, BOW_JWT_SECRET=SECRET) as served:
        listening = await Listening.start("--url", served.url, "--id", "USER/44")
        await listening.until("listening on")
        assert await asyncio.to_thread(served.stop) == 0
        ended = await listening.end()
    assert ended.code == 1
    assert "disconnected by the server" in ended.err
    assert_closed_cleanly(ended)
