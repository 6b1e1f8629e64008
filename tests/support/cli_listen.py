"""``bow-gateway listen`` as a real process: start it, read its lines, push to what it listens
to."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from . import SECRET
from .served import BOW_GATEWAY, Served, clean_env

Pipe = asyncio.subprocess.PIPE
BASIC = "Basic " + base64.b64encode(b"pusher:change-me").decode()  # the embedded default's


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
            *BOW_GATEWAY,
            "listen",
            *args,
            stdout=Pipe,
            stderr=Pipe,
            env=clean_env(BOW_JWT_SECRET=SECRET),
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


def assert_closed_cleanly(ended: Ended) -> None:
    assert "Unclosed" not in ended.err, ended.err
    assert "Traceback" not in ended.err, ended.err


def push_at(served: Served, name: str, audience: list[dict[str, object]], **more: object) -> str:
    """POST a message; its position, from the 204's ``Bow-Position`` header."""
    return pushed(served, name, audience, **more)[0]


def pushed(
    served: Served, name: str, audience: list[dict[str, object]], **more: object
) -> tuple[str, str]:
    """POST a message; its ``Bow-Position`` and ``Bow-Message-Id``."""
    request = urllib.request.Request(
        served.url + "/v1/messages",
        data=json.dumps({"name": name, "audience": audience, **more}).encode(),
        headers={"Content-Type": "application/json", "Authorization": BASIC},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 204
        return response.headers["Bow-Position"], response.headers["Bow-Message-Id"]


async def next_line(listening: Listening, timeout: float = 10) -> dict[str, Any]:
    """The next JSON line listen printed on stdout."""
    assert listening.process.stdout is not None
    line = await asyncio.wait_for(listening.process.stdout.readline(), timeout)
    assert line, f"listen ended:\n{listening.err}"
    parsed: dict[str, Any] = json.loads(line)
    return parsed
