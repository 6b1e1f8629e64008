"""The machine a benchmark runs on: its description, waiting for it to be quiet, pinning, limits."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata

from lib import ROOT
from lib.proc import machine_busy_seconds


def load_average() -> str:
    with open("/proc/loadavg", encoding="ascii") as loadavg:
        return " ".join(loadavg.read().split()[:3])


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for row in cpuinfo:
                if row.startswith("model name"):
                    return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment(packages: Sequence[str]) -> str:
    """One paragraph naming the date, machine, Python and library versions."""
    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return "\n".join(
        [
            f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
            f"cpu: {cpu_model()} ({os.cpu_count()} logical CPUs, usable: {affinity})",
            f"python: {sys.version.split()[0]} ({platform.python_implementation()}) on "
            f"{platform.system()} {platform.release()}",
            "libraries: " + ", ".join(versions),
            f"load average at start (1, 5, 15 min): {load_average()}",
        ]
    )


def wait_for_quiet(limit: float, seconds: int = 3, threshold: float = 0.1) -> bool:
    """Wait until the machine has been quiet (every process together under ``threshold`` of a
    CPU) for ``seconds`` seconds in a row, at most ``limit`` seconds; False if it never was."""
    started = time.monotonic()
    quiet = 0
    while time.monotonic() - started < limit:
        before = machine_busy_seconds()
        time.sleep(1)
        quiet = quiet + 1 if machine_busy_seconds() - before < threshold else 0
        if quiet >= seconds:
            return True
    print(f"  (the machine was not quiet within {limit:g} s: going on anyway)", flush=True)
    return False


def raise_open_files_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit (children inherit it); returns the limits now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def pin_gateway(pid: int, cpu: int) -> None:
    """``taskset`` every thread of the gateway onto ``cpu``."""
    subprocess.run(
        ["taskset", "-a", "-p", "-c", str(cpu), str(pid)], check=True, stdout=subprocess.DEVNULL
    )


def git_state() -> str:
    """This checkout's commit, and the files of bow_gateway/ changed since, if any."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "bow_gateway"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        changed = [line[3:] for line in dirty if line.strip()]
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (f" + uncommitted changes in {', '.join(changed)}" if changed else "")
