"""Benchmark of ``bow-gateway criteria-job``: full runs from Parquet and PostgreSQL, incremental.

Run:  .venv/bin/python bench/criteria_job_bench.py [--listeners 1000000] [--small 10000]
      [--churn 0.01] [--postgres postgresql://postgres@127.0.0.1:5432/test] [--no-postgres]
      [--class-archive /var/tmp/bow-spark.jsa] [--wide 1000000] [--conf KEY=VALUE ...]

``--job-root DIR`` runs another checkout's job (its ``.venv/bin/bow-gateway``) with this script,
e.g. to compare before and after a change. A plain script, not a test. It starts a private
``redis-server`` (free port, no persistence, ``hash-max-listpack-value 512``), measures Redis's
own pipelined write ceiling on it (``redis-benchmark -P 64 -t set``, distinct keys), makes the
data set of bench/criteria_data.py (Parquet files and PostgreSQL schema ``bow_bench``), then runs
the real command line, each run a fresh process (so every wall time includes starting Python,
the JVM and Spark):

1. a full run from Parquet, 2. a full run from PostgreSQL (JDBC, 4 partitions per table),
3. ``--churn`` of the listeners changed in PostgreSQL, then an incremental run,
4. a full run of ``--small`` listeners from Parquet,
5. a full run from Parquet of ``--wide`` listeners of the other shape of criteria_data.py (string
   ids, 12 criteria with long strings, Zipf-skewed groups; ``--wide 0`` leaves it out).

With ``--class-archive`` the job files set ``spark.class_archive`` (an AppCDS archive of Spark's
classes: a faster JVM start); a first run of the small data set makes the archive when it does
not exist yet, and is not counted.

It prints wall time, CPU seconds of the job's processes by kind (its driver and Python workers,
the JVM; sampled from /proc), of Redis (its INFO) and of every other process of the machine
meanwhile ("other"), the same for the write phase alone (between its progress lines), its rate
and its fraction of the ``redis-benchmark`` ceiling,
Redis memory per listener (``used_memory`` over the live snapshot, and ``MEMORY USAGE`` of sampled
buckets against the bytes of their fields and values), and what each run wrote to Redis
(``HSET``/``HDEL`` calls and bytes received, from ``INFO``), with the issue's targets.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _common as common
import criteria_data as data
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bow_gateway.criteria_snapshot import Layout, Live  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

NAMESPACE = "bench"
JOB_ROOT = ROOT
QUIET_WAIT = 60.0
"""Seconds each run waits at most for a quiet machine (``--quiet-wait``)."""
"""The checkout whose ``.venv/bin/bow-gateway`` runs the job (``--job-root``)."""
EXTRA_CONF: dict[str, str] = {}
"""``--conf KEY=VALUE``: more Spark settings in every job file (e.g. to compare a setting)."""
JAR = "/usr/share/java/postgresql.jar"


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


def job_file(
    folder: Path,
    name: str,
    redis_url: str,
    inputs: str,
    state: Path,
    archive: str | None,
    query: str = data.QUERY,
) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(
        f'[redis]\nurl = "{redis_url}"\nnamespace = "{NAMESPACE}"\n'
        + (f'[spark]\nclass_archive = "{archive}"\n' if archive else "")
        + '[spark.conf]\n"spark.ui.enabled" = "false"\n"spark.driver.memory" = "3g"\n'
        + "".join(f'"{key}" = "{value}"\n' for key, value in EXTRA_CONF.items())
        + inputs
        + f'[criteria]\nquery = """{query}"""\n'
        + f'[snapshot]\ngrace_seconds = 0\nstate_dir = "{state}"\n'
    )
    return path


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
                    cpu = common.cpu_seconds(pid)
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


def run_job(config: Path, client: redis.Redis, incremental: bool = False) -> dict[str, Any]:
    """One ``bow-gateway criteria-job`` process; its wall time, summary, CPU and Redis writes."""
    common.wait_for_quiet(QUIET_WAIT)
    client.config_resetstat()
    received = int(client.info("stats")["total_net_input_bytes"])
    command = [str(JOB_ROOT / ".venv/bin/bow-gateway"), "criteria-job", "--config", str(config)]
    if incremental:
        command.append("--incremental")
    redis_before, busy_before = redis_cpu(client), common.machine_busy_seconds()
    load = common.load_average()
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
    cpu["other"] = max(0.0, common.machine_busy_seconds() - busy_before - sum(cpu.values()))
    if process.returncode != 0:
        raise SystemExit(f"the job failed ({process.returncode}):\n{err[-3000:]}")
    calls = client.info("commandstats")
    summary = out
    write = re.search(r"write phase\s+([\d.]+) s\s+\(([\d,]+) listeners/s\)", summary)
    assert write is not None, summary
    numbers = {
        key: int(m.group(1).replace(",", ""))
        for key in ("listeners read", "written", "changed", "removed")
        if (m := re.search(rf"{key}\s+([\d,]+)", summary))
    }
    phases = [line for line in err.splitlines() if line.startswith("[")]
    return {
        "wall": wall,
        "load": load,
        "cpu": cpu,
        "write_cpu": write_cpu,
        "write_seconds": float(write.group(1)),
        "rate": int(write.group(2).replace(",", "")),
        "hset": calls.get("cmdstat_hset", {}).get("calls", 0),
        "hdel": calls.get("cmdstat_hdel", {}).get("calls", 0),
        "bytes": int(client.info("stats")["total_net_input_bytes"]) - received,
        "phases": phases,
        **numbers,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--listeners", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--churn", type=float, default=0.01)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--schema", default="bow_bench")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--class-archive", metavar="FILE", help="spark.class_archive (AppCDS)")
    parser.add_argument(
        "--wide", type=int, help="listeners of the wide shape (default: --listeners; 0: none)"
    )
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting"
    )
    parser.add_argument("--quiet-wait", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument(
        "--job-root", metavar="DIR", help="run the job of another checkout (its .venv)"
    )
    args = parser.parse_args()
    global JOB_ROOT, QUIET_WAIT
    JOB_ROOT = Path(args.job_root).resolve() if args.job_root else ROOT
    QUIET_WAIT = args.quiet_wait
    EXTRA_CONF.update(item.split("=", 1) for item in args.conf)
    wide_listeners = args.listeners if args.wide is None else args.wide
    jdbc = "jdbc:" + re.sub(r"^postgresql://(?:[^@/]*@)?", "postgresql://", args.postgres)
    print(common.environment(["pyspark", "pyarrow", "redis"]), flush=True)
    work = Path(tempfile.mkdtemp(prefix="bow-criteria-bench-"))
    archive = args.class_archive
    with RedisServer(config={"hash-max-listpack-value": 512}) as server:
        client = redis.Redis.from_url(server.url)
        print(f"\nredis-server {client.info('server')['redis_version']} on port {server.port}")
        ceiling = redis_ceiling(server.port)
        client.flushall()
        print(f"redis-benchmark -P 64 -t set (distinct keys): {ceiling:,.0f} SETs/s", flush=True)

        started = time.perf_counter()
        dataset = data.generate(args.listeners)
        data.write_parquet(dataset, work / "parquet")
        if not args.no_postgres:
            asyncio.run(data.write_postgres(dataset, args.postgres, args.schema))
        small = data.generate(args.small)
        data.write_parquet(small, work / "small")
        print(
            f"data set: {dataset.users.num_rows:,} users, {dataset.memberships.num_rows:,}"
            f" memberships ({time.perf_counter() - started:.0f} s to make)",
            flush=True,
        )

        small_file = job_file(
            work, "small", server.url, parquet_inputs(work / "small"), work / "small-state", archive
        )
        if archive and not os.path.exists(archive):
            print("\nmaking the class archive (a run of the small data set, not counted)")
            run_job(small_file, client)
        client.flushall()
        baseline = int(client.info("memory")["used_memory"])

        results: list[tuple[str, dict[str, Any]]] = []
        state = work / "state"
        from_parquet = job_file(
            work, "parquet", server.url, parquet_inputs(work / "parquet"), state, archive
        )
        results.append(("full, Parquet", run_job(from_parquet, client)))
        _report(*results[-1])
        full = results[-1][1]
        from_pg = from_parquet
        if not args.no_postgres:
            from_pg = job_file(
                work,
                "postgres",
                server.url,
                postgres_inputs(jdbc, args.schema, args.listeners),
                state,
                archive,
            )
            results.append(("full, PostgreSQL", run_job(from_pg, client)))
            _report(*results[-1])
        used = memory(client, baseline, args.listeners)

        changed, touched = data.churn(dataset, args.churn)
        if args.no_postgres:
            data.write_parquet(changed, work / "parquet")
        else:
            asyncio.run(data.write_postgres(changed, args.postgres, args.schema))
        results.append(
            (f"incremental, {args.churn:.0%} churn", run_job(from_pg, client, incremental=True))
        )
        _report(*results[-1])
        incremental = results[-1][1]

        client.delete(Layout(NAMESPACE).live_key)  # a fresh start for the small run
        results.append((f"full, {args.small:,}, Parquet", run_job(small_file, client)))
        _report(*results[-1])

        wide_used = None
        if wide_listeners:
            started = time.perf_counter()
            data.write_parquet(data.generate_wide(wide_listeners), work / "wide")
            print(f"\nwide data set: {wide_listeners:,} accounts"
                  f" ({time.perf_counter() - started:.0f} s to make)", flush=True)  # fmt: skip
            client.flushall()
            wide_baseline = int(client.info("memory")["used_memory"])
            inputs = parquet_inputs(work / "wide", ("accounts", "group_members"))
            wide_file = job_file(
                work, "wide", server.url, inputs, work / "wide-state", archive, data.WIDE_QUERY
            )
            results.append((f"full, wide {wide_listeners:,}, Parquet", run_job(wide_file, client)))
            _report(*results[-1])
            wide_used = memory(client, wide_baseline, wide_listeners)

    print(
        "\n"
        + common.table(
            [
                "run",
                "wall s",
                "write s",
                "listeners/s",
                "of ceiling",
                "HSET+HDEL",
                "MB to Redis",
                "CPU s: JVM",
                "Python",
                "Redis",
                "other",
                "write CPU s: JVM",
                "Python",
                "Redis",
                "load",
            ],
            [
                [
                    name,
                    f"{r['wall']:.1f}",
                    f"{r['write_seconds']:.1f}",
                    f"{r['rate']:,}",
                    f"{r['rate'] / ceiling:.2f}",
                    f"{r['hset'] + r['hdel']:,}",
                    f"{r['bytes'] / 1e6:.1f}",
                    f"{r['cpu'].get('jvm', 0):.1f}",
                    f"{r['cpu'].get('driver', 0) + r['cpu'].get('python', 0):.1f}",
                    f"{r['cpu']['redis']:.1f}",
                    f"{r['cpu']['other']:.1f}",
                    f"{r['write_cpu'].get('jvm', 0):.1f}",
                    f"{r['write_cpu'].get('driver', 0) + r['write_cpu'].get('python', 0):.1f}",
                    f"{r['write_cpu'].get('redis', 0):.1f}",
                    r["load"].split()[0],
                ]
                for name, r in results
            ],
        )
    )
    print(
        f"\nmemory per listener (live snapshot of {args.listeners:,}): {used['used']:.1f} B"
        f" (used_memory); sampled buckets: {used['usage']:.1f} B in Redis for"
        f" {used['payload']:.1f} B of field + value; encodings {used['encodings']}"
    )
    if wide_used is not None:
        print(
            f"memory per listener (wide, {wide_listeners:,}): {wide_used['used']:.1f} B"
            f" (used_memory); sampled buckets: {wide_used['usage']:.1f} B in Redis for"
            f" {wide_used['payload']:.1f} B of field + value; encodings {wide_used['encodings']}"
        )
    writes = incremental["changed"] + incremental["removed"]
    print(
        f"incremental: {touched:,} listeners touched; {incremental['changed']:,} changed,"
        f" {incremental['removed']:,} removed: {writes / args.listeners:.1%} of the listener"
        f" writes and {incremental['bytes'] / full['bytes']:.1%} of the bytes of a full run"
    )
    print(
        "targets: full run <= 30 s; write phase >= 250,000/s and >= 0.5 of the ceiling;"
        " <= 100 B/listener; 10,000-listener run <= 20 s; incremental at 1% <= 3% of the"
        " writes; issue 16: full run from Parquet <= 20 s with the class archive, <= 60 B/listener"
    )


def _report(name: str, result: dict[str, Any]) -> None:
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


if __name__ == "__main__":
    main()
