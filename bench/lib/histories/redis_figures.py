"""Redis's own figures for ``history_bench.py``: command statistics, memory, PING latency."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

from redis.asyncio import Redis


async def commandstats(client: Redis) -> dict[str, tuple[int, int]]:
    """``INFO commandstats``: command -> (calls, µs)."""
    info = await client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in info.items()
        if isinstance(v, dict)
    }


def commandstats_delta(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> list[tuple[str, int, int]]:
    rows = []
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls > c0:
            rows.append((name, calls - c0, usec - u0))
    return sorted(rows, key=lambda row: -row[2])


async def memory_usage(client: Redis, key: str) -> int:
    usage = await client.execute_command(  # type: ignore[no-untyped-call]
        "MEMORY", "USAGE", key, "SAMPLES", "0"
    )
    return int(usage or 0)


async def used_memory(client: Redis) -> int:
    await asyncio.sleep(0.5)  # let the AOF buffer and the clients' buffers drain
    return int((await client.info("memory"))["used_memory"])


def redis_latency(port: int, seconds: float) -> subprocess.Popen[str] | None:
    """``redis-cli --latency --raw -i seconds``: one line, min max avg (ms) and samples."""
    if shutil.which("redis-cli") is None:
        return None
    command = [
        "redis-cli",
        "-p",
        str(port),
        "--latency",
        "--raw",
        "-i",
        str(max(1, round(seconds))),
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def latency_text(process: subprocess.Popen[str] | None) -> str:
    if process is None:
        return "redis-cli is not on PATH"
    try:
        out, _ = process.communicate(timeout=30)
        low, high, mean, samples = out.split()[:4]
    except (subprocess.TimeoutExpired, ValueError):
        process.kill()
        return "no answer"
    return f"min {low} ms, avg {mean} ms, max {high} ms over {int(samples):,} PINGs"
