"""Counting instructions with valgrind's callgrind (``instructions_bench.py``,
``id_instructions_bench.py``): counting on and off in a running process, the totals of its dumps,
and the gateways measured in alternation."""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import Callable, Coroutine
from typing import Any

from lib import machine

TOTALS = re.compile(rb"^totals:\s+(\d+)", re.MULTILINE)


def control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def compare(
    gateways: list[str] | None,
    rounds: int,
    measure: Callable[[str | None], Coroutine[Any, Any, float]],
) -> None:
    """``measure`` each gateway (None: this checkout) ``rounds`` times in alternation, printing
    instructions per message, then each one's best against the first's."""
    print(machine.environment(["aiohttp", "redis", "hiredis"]), flush=True)
    sources: list[str | None] = [*gateways] if gateways else [None]
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        for source in sources:
            name = source or "this checkout"
            ir = asyncio.run(measure(source))
            results.setdefault(name, []).append(ir)
            print(f"{name}: {ir:,.0f} instructions per message", flush=True)
    if len(sources) > 1:
        first = min(results[sources[0] or "this checkout"])
        for name, irs in results.items():
            print(f"{name}: best {min(irs):,.0f} ({min(irs) / first:.2f} of the first)")
