"""The ``bow-gateway`` command line run as real processes: to its end, as a line pasted into
bash, or long-running (its lines read, signalled, collected)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import dataclass

from .served import BOW_GATEWAY, clean_env

# Runs a printed command as printed: `bow-gateway` is the console script beside this interpreter
# (exec, so that signals reach it), whether or not it is on PATH.
SHELL_PRELUDE = f'bow-gateway() {{ exec "{BOW_GATEWAY[0]}" "$@"; }}\n'
Pipe = asyncio.subprocess.PIPE


async def run(*args: str, env: dict[str, str] | None = None, timeout: float = 20) -> Result:
    """Run ``python -m bow_gateway ARGS`` to its end."""
    return await run_process(*BOW_GATEWAY, *args, env=env, timeout=timeout)


async def run_shell(script: str, timeout: float = 20, **env: str) -> Result:
    """Run a command line as a user pastes it into bash."""
    return await run_process(
        "bash", "-c", SHELL_PRELUDE + script, env=clean_env(**env), timeout=timeout
    )


@dataclass
class Result:
    code: int
    out: str
    err: str


async def run_process(*argv: str, env: dict[str, str] | None, timeout: float) -> Result:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=Pipe, stderr=Pipe, env=env if env is not None else clean_env()
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.communicate()
        raise
    assert process.returncode is not None
    return Result(process.returncode, out.decode(), err.decode())


class Running:
    """A long-running command (``listen``, ``serve``): read its lines, signal it, collect it."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.err: list[str] = []

    @classmethod
    async def start(cls, *argv: str, env: dict[str, str] | None = None) -> Running:
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=Pipe, stderr=Pipe, env=env if env is not None else clean_env()
        )
        return cls(process)

    async def stdout_line(self, timeout: float = 10) -> str:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        return line.decode()

    async def stderr_until(self, found: Callable[[str], bool], timeout: float = 15) -> str:
        """Read stderr until a line satisfies ``found``; return it."""
        assert self.process.stderr is not None
        async with asyncio.timeout(timeout):
            while True:
                line = (await self.process.stderr.readline()).decode()
                self.err.append(line)
                if not line:
                    raise AssertionError("stderr ended:\n" + "".join(self.err))
                if found(line):
                    return line

    async def stop(self, timeout: float = 5, signal_number: int = signal.SIGTERM) -> Result:
        """SIGTERM (or another signal), then its exit status and the rest of its output."""
        if self.process.returncode is None:
            self.process.send_signal(signal_number)
        return await self.finish(timeout)

    async def finish(self, timeout: float = 10) -> Result:
        try:
            out, err = await asyncio.wait_for(self.process.communicate(), timeout)
        except TimeoutError:
            self.process.kill()
            await self.process.communicate()
            raise
        assert self.process.returncode is not None
        return Result(self.process.returncode, out.decode(), "".join(self.err) + err.decode())
