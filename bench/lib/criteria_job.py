"""``criteria_job_bench.py``'s runs of ``bow-gateway criteria-job``: job files, one run in a
process of its own (its CPU by kind of process, sampled from /proc, and what it wrote to Redis),
Redis's pipelined write ceiling, and the memory a listener takes in Redis."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bow_gateway.core.criteria_snapshot import Layout, Live
from lib import machine, proc

NAMESPACE = "bench"
JAR = "/usr/share/java/postgresql.jar"


@dataclass
class Jobs:
    """How every run goes: whose job, how long it waits for a quiet machine, more settings."""

    root: Path
    """The checkout whose ``.venv/bin/bow-gateway`` runs the job (``--job-root``)."""
    quiet_wait: float = 60.0
    """Seconds each run waits at most for a quiet machine (``--quiet-wait``)."""
    extra_conf: dict[str, str] = field(default_factory=dict)
    """``--conf KEY=VALUE``: more Spark settings in every job file (e.g. to compare a setting)."""

    def job_file(
        self,
        folder: Path,
        name: str,
        redis_url: str,
        inputs: str,
        state: Path,
        archive: str | None,
        query: str,
    ) -> Path:
        path = folder / f"{name}.toml"
        path.write_text(
            f'[redis]\nurl = "{redis_url}"\nnamespace = "{NAMESPACE}"\n'
            + (f'[spark]\nclass_archive = "{archive}"\n' if archive else "")
            + '[spark.conf]\n"spark.ui.enabled" = "false"\n"spark.driver.memory" = "3g"\n'
            + "".join(f'"{key}" = "{value}"\n' for key, value in self.extra_conf.items())
            + inputs
            + f'[criteria]\nquery = """{query}"""\n'
            + f'[snapshot]\ngrace_seconds = 0\nstate_dir = "{state}"\n'
        )
        return path

    def run(self, config: Path, client: redis.Redis, incremental: bool = False) -> dict[str, Any]:
        """One ``bow-gateway criteria-job`` process; its wall time, summary, CPU and Redis
        writes."""
        machine.wait_for_quiet(self.quiet_wait)
        client.config_resetstat()
        received = int(client.info("stats")["total_net_input_bytes"])
        command = [str(self.root / ".venv/bin/bow-gateway"), "criteria-job", "--config"]
        command.append(str(config))
        if incremental:
            command.append("--incremental")
        run = run_process(command, client)
        calls = client.info("commandstats")
        summary = run.pop("out")
        write = re.search(r"write phase\s+([\d.]+) s\s+\(([\d,]+) listeners/s\)", summary)
        assert write is not None, summary
        numbers = {
            key: int(m.group(1).replace(",", ""))
            for key in ("listeners read", "written", "changed", "removed")
            if (m := re.search(rf"{key}\s+([\d,]+)", summary))
        }
        return {
            **run,
            "write_seconds": float(write.group(1)),
            "rate": int(write.group(2).replace(",", "")),
            "hset": calls.get("cmdstat_hset", {}).get("calls", 0),
            "hdel": calls.get("cmdstat_hdel", {}).get("calls", 0),
            "bytes": int(client.info("stats")["total_net_input_bytes"]) - received,
            **numbers,
        }


def redis_ceiling(port: int, requests: int = 2_000_000) -> float:
    """SETs per second that ``redis-benchmark -P 64`` gets from this server (distinct keys)."""
    out = subprocess.run(
        [
            "redis-benchmark",
            "-p",
            str(port),
            "-P",
            "64",
            "-t",
            "set",
            "-n",
            str(requests),
            "-r",
            str(requests),
            "-q",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"SET: ([\d.]+) requests per second", out.replace("\r", "\n"))
    if match is None:
        raise SystemExit(f"could not read redis-benchmark's output: {out!r}")
    return float(match.group(1))


def parquet_inputs(folder: Path, names: tuple[str, ...] = ("users", "roles", "memberships")) -> str:
    return "".join(
        f'[[inputs]]\nname = "{n}"\nformat = "parquet"\npath = "{folder}/{n}.parquet"\n'
        for n in names
    )


def postgres_inputs(jdbc: str, schema: str, listeners: int) -> str:
    common_options = f'url = "{jdbc}"\nuser = "postgres"\njar = "{JAR}"\nfetch_size = 10000\n'
    bounds = f"lower_bound = 1\nupper_bound = {listeners}\nnum_partitions = 4\n"
    return (
        f'[[inputs]]\nname = "users"\nformat = "jdbc"\ntable = "{schema}.users"\n'
        f'{common_options}partition_column = "id"\n{bounds}'
        f'[[inputs]]\nname = "roles"\nformat = "jdbc"\ntable = "{schema}.roles"\n{common_options}'
        f'[[inputs]]\nname = "memberships"\nformat = "jdbc"\ntable = "{schema}.memberships"\n'
        f'{common_options}partition_column = "user_id"\n{bounds}'
    )


class TreeCPU:
    """CPU seconds of a process and its descendants, by kind (the job's driver, the JVM, the
    Python workers), sampled from /proc while it runs (a process is counted at its last sample)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[int, tuple[str, float]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stop.wait(0.2):
            parents: dict[int, int] = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                            text = stat.read()
                        parents[int(entry)] = int(text[text.rindex(")") + 2 :].split()[1])
                    except (OSError, ValueError):
                        continue
            tree, grew = {self.root}, True
            while grew:
                found = {pid for pid, parent in parents.items() if parent in tree} - tree
                grew = bool(found)
                tree |= found
            for pid in tree:
                try:
                    cpu = proc.cpu_seconds(pid)
                    with open(f"/proc/{pid}/comm", encoding="utf-8") as comm:
                        name = comm.read().strip()
                except OSError:
                    continue
                if pid == self.root:
                    kind = "driver"
                elif name == "java":
                    kind = "jvm"
                else:  # PySpark's daemon and workers (anything else the job would start)
                    kind = "python"
                self.seen[pid] = (kind, cpu)

    def now(self) -> dict[str, float]:
        """The CPU seconds so far, by kind."""
        found: dict[str, float] = {}
        for kind, cpu in list(self.seen.values()):
            found[kind] = found.get(kind, 0.0) + cpu
        return found

    def totals(self) -> dict[str, float]:
        self.stop.set()
        self.thread.join()
        return self.now()


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def run_process(command: list[str], client: redis.Redis) -> dict[str, Any]:
    """Run the job: its wall time, the load average before, its CPU by kind (and Redis's, and
    every other process's), the same for the write phase alone (between its progress lines),
    its progress lines and its output (the summary)."""
    redis_before, busy_before = redis_cpu(client), proc.machine_busy_seconds()
    load = machine.load_average()
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = TreeCPU(process.pid)
    marks: dict[str, dict[str, float]] = {}  # the CPU seconds when the write phase began, ended

    def progress() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if re.search(r"\] (writing snapshot|writing the changes)", line):
                time.sleep(0.25)  # a sample after the line
                marks["begin"] = {**sampler.now(), "redis": redis_cpu(client)}
            elif re.search(r"\] (wrote \d|[\d,]+ changed, )", line):
                time.sleep(0.25)
                marks["end"] = {**sampler.now(), "redis": redis_cpu(client)}

    lines: list[str] = []
    reader = threading.Thread(target=progress, daemon=True)
    reader.start()
    out = process.stdout.read() if process.stdout is not None else ""
    process.wait()
    reader.join()
    err = "".join(lines)
    wall = time.perf_counter() - started
    cpu = sampler.totals()
    write_cpu = {
        kind: marks["end"].get(kind, 0.0) - marks["begin"].get(kind, 0.0)
        for kind in ("driver", "jvm", "python", "redis")
        if "begin" in marks and "end" in marks
    }
    cpu["redis"] = redis_cpu(client) - redis_before
    cpu["other"] = max(0.0, proc.machine_busy_seconds() - busy_before - sum(cpu.values()))
    if process.returncode != 0:
        raise SystemExit(f"the job failed ({process.returncode}):\n{err[-3000:]}")
    phases = [line for line in err.splitlines() if line.startswith("[")]
    return {
        "wall": wall,
        "load": load,
        "cpu": cpu,
        "write_cpu": write_cpu,
        "phases": phases,
        "out": out,
    }


def memory(client: redis.Redis, baseline: int, listeners: int) -> dict[str, Any]:
    """Bytes per listener: all of Redis's growth, and sampled buckets against their payload."""
    layout = Layout(NAMESPACE)
    live = Live.from_json(client.get(layout.live_key))
    assert live is not None
    used = int(client.info("memory")["used_memory"]) - baseline
    usage = payload = entries = 0
    encodings: dict[str, int] = {}
    for bucket in range(0, live.buckets, max(1, live.buckets // 200)):
        key = layout.bucket_key(live.snapshot, bucket)
        usage += int(client.memory_usage(key, samples=0) or 0)
        pairs = client.hgetall(key)
        payload += sum(len(f) + len(v) for f, v in pairs.items())
        entries += len(pairs)
        encoding = client.object("encoding", key).decode()
        encodings[encoding] = encodings.get(encoding, 0) + 1
    return {
        "used": used / listeners,
        "usage": usage / entries,
        "payload": payload / entries,
        "encodings": encodings,
    }


def report(name: str, result: dict[str, Any]) -> None:
    cpu = ", ".join(f"{kind} {seconds:.1f}" for kind, seconds in sorted(result["cpu"].items()))
    cpu += "; in the write phase: " + ", ".join(
        f"{kind} {seconds:.1f}" for kind, seconds in sorted(result["write_cpu"].items())
    )
    print(
        f"\n{name}: {result['wall']:.1f} s wall, write phase {result['write_seconds']:.1f} s"
        f" ({result['rate']:,} listeners/s); load {result['load']}; CPU s: {cpu}",
        flush=True,
    )
    for line in result["phases"]:
        print(f"  {line}")
