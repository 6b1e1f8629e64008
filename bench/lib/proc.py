"""What ``/proc`` says of processes and CPUs: RSS, CPU seconds, each core's busy time."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in KiB, from /proc."""
    result: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for row in status:
            if row.startswith(("VmRSS:", "VmHWM:")):
                key, value = row.split(":", 1)
                result[key] = int(value.split()[0])
    return result


def cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process (all its threads) in seconds, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        text = stat.read()
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS  # fields 14, 15 of proc(5)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process in seconds."""
    return sum(cpu_times(pid))


def machine_busy_seconds() -> float:
    """CPU seconds spent by every CPU of the machine outside idle and iowait, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def cpu_busy() -> dict[int, tuple[float, float]]:
    """Per CPU: (seconds not idle, of which in softirq), from /proc/stat: whether a core was
    saturated, whoever used it (softirq: mostly the kernel's loopback TCP work)."""
    result = {}
    with open("/proc/stat", encoding="ascii") as stat:
        for row in stat:
            name, *fields = row.split()
            if name.startswith("cpu") and name != "cpu":
                ticks = [int(v) for v in fields[:8]]
                busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
                result[int(name[3:])] = (busy / CLOCK_TICKS, ticks[6] / CLOCK_TICKS)
    return result


def cpu_delta(
    before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]]
) -> dict[int, tuple[float, float]]:
    return {cpu: (a[0] - before[cpu][0], a[1] - before[cpu][1]) for cpu, a in after.items()}


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as file:
            return [int(p) for p in file.read().split()]
    except OSError:
        return []


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Machine:
    """CPU-time snapshots of every process class."""

    def __init__(self, gateways: Sequence[int], redis: int | None, loadgens: Sequence[int]):
        self.gateways, self.redis, self.loadgens = list(gateways), redis, list(loadgens)

    def snapshot(self) -> dict[str, Any]:
        return {
            "gateways": [cpu_seconds(pid) for pid in self.gateways],
            "redis": cpu_seconds(self.redis) if self.redis else 0.0,
            "loadgen": sum(cpu_seconds(pid) for pid in self.loadgens) + time.process_time(),
            "busy": machine_busy_seconds(),
        }

    @staticmethod
    def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        gateways = [a - b for a, b in zip(after["gateways"], before["gateways"], strict=True)]
        redis = after["redis"] - before["redis"]
        loadgen = after["loadgen"] - before["loadgen"]
        busy = after["busy"] - before["busy"]
        return {
            "gateways": gateways,
            "redis": redis,
            "loadgen": loadgen,
            "other": max(0.0, busy - sum(gateways) - redis - loadgen),
        }
