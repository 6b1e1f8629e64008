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
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from lib import ROOT, machine, stats
from lib import criteria_data as data
from lib.criteria_job import (
    NAMESPACE,
    Jobs,
    memory,
    parquet_inputs,
    postgres_inputs,
    redis_ceiling,
    report,
)

sys.path.insert(0, str(ROOT))
from bow_gateway.core.criteria_snapshot import Layout
from tests.support.redis_server import RedisServer


@dataclass
class Bench:
    """One session: its options, its job runs, its work directory and Redis, what ran."""

    args: argparse.Namespace
    jobs: Jobs
    work: Path
    url: str  # the private Redis's
    client: redis.Redis
    archive: str | None
    results: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def run(self, name: str, config: Path, incremental: bool = False) -> dict[str, Any]:
        self.results.append((name, self.jobs.run(config, self.client, incremental)))
        report(*self.results[-1])
        return self.results[-1][1]

    def job_file(self, name: str, inputs: str, state: Path, query: str = data.QUERY) -> Path:
        return self.jobs.job_file(self.work, name, self.url, inputs, state, self.archive, query)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
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
    parser.add_argument(
        "--index-ab",
        type=int,
        default=0,
        metavar="PAIRS",
        help="only full Parquet runs with and without the audience index, alternating, PAIRS"
        " of each: the wall time ratio and the index's bytes per listener-criterion pair",
    )
    return parser


def main() -> None:
    args = build_parser().parse_args()
    jobs = Jobs(Path(args.job_root).resolve() if args.job_root else ROOT, args.quiet_wait)
    jobs.extra_conf.update(item.split("=", 1) for item in args.conf)
    wide_listeners = args.listeners if args.wide is None else args.wide
    print(machine.environment(["pyspark", "pyarrow", "redis"]), flush=True)
    work = Path(tempfile.mkdtemp(prefix="bow-criteria-bench-"))
    with RedisServer(config={"hash-max-listpack-value": 512}) as server:
        client = redis.Redis.from_url(server.url)
        print(f"\nredis-server {client.info('server')['redis_version']} on port {server.port}")
        ceiling = redis_ceiling(server.port)
        client.flushall()
        print(f"redis-benchmark -P 64 -t set (distinct keys): {ceiling:,.0f} SETs/s", flush=True)
        bench = Bench(args, jobs, work, server.url, client, args.class_archive)
        dataset, small_file = make_data(bench)
        if args.index_ab:
            index_ab(bench, args.index_ab)
            return
        full, used, from_pg = full_runs(bench, dataset)
        touched, incremental = incremental_run(bench, dataset, from_pg)
        client.delete(Layout(NAMESPACE).live_key)  # a fresh start for the small run
        bench.run(f"full, {args.small:,}, Parquet", small_file)
        wide_used = wide_run(bench, wide_listeners) if wide_listeners else None

    print_table(bench.results, ceiling)
    print_memory(args.listeners, used, wide_listeners, wide_used)
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


def print_table(results: list[tuple[str, dict[str, Any]]], ceiling: float) -> None:
    print(
        "\n"
        + stats.table(
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


def make_data(bench: Bench) -> tuple[data.Dataset, Path]:
    """The data set in Parquet (and PostgreSQL), and the small one; the small one's job file
    (its first run makes the class archive if there is none yet)."""
    args, work, client, archive = bench.args, bench.work, bench.client, bench.archive
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

    small_file = bench.job_file("small", parquet_inputs(work / "small"), work / "small-state")
    if archive and not os.path.exists(archive):
        print("\nmaking the class archive (a run of the small data set, not counted)")
        bench.jobs.run(small_file, client)
    client.flushall()
    return dataset, small_file


def full_runs(bench: Bench, dataset: data.Dataset) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """A full run from Parquet, then from PostgreSQL: the first's result, the memory per
    listener, the job file of the incremental run."""
    args, work, client = bench.args, bench.work, bench.client
    jdbc = "jdbc:" + re.sub(r"^postgresql://(?:[^@/]*@)?", "postgresql://", args.postgres)
    baseline = int(client.info("memory")["used_memory"])
    state = work / "state"
    from_parquet = bench.job_file("parquet", parquet_inputs(work / "parquet"), state)
    full = bench.run("full, Parquet", from_parquet)
    from_pg = from_parquet
    if not args.no_postgres:
        inputs = postgres_inputs(jdbc, args.schema, args.listeners)
        from_pg = bench.job_file("postgres", inputs, state)
        bench.run("full, PostgreSQL", from_pg)
    used = memory(client, baseline, args.listeners)
    return full, used, from_pg


def incremental_run(
    bench: Bench, dataset: data.Dataset, from_pg: Path
) -> tuple[int, dict[str, Any]]:
    """``--churn`` of the listeners changed, then an incremental run: (listeners touched,
    its result)."""
    args, work = bench.args, bench.work
    changed, touched = data.churn(dataset, args.churn)
    if args.no_postgres:
        data.write_parquet(changed, work / "parquet")
    else:
        asyncio.run(data.write_postgres(changed, args.postgres, args.schema))
    incremental = bench.run(f"incremental, {args.churn:.0%} churn", from_pg, incremental=True)
    return touched, incremental


def wide_run(bench: Bench, wide_listeners: int) -> dict[str, Any]:
    """A full run of the wide shape from Parquet; its memory per listener."""
    work, client = bench.work, bench.client
    started = time.perf_counter()
    data.write_parquet(data.generate_wide(wide_listeners), work / "wide")
    print(f"\nwide data set: {wide_listeners:,} accounts"
          f" ({time.perf_counter() - started:.0f} s to make)", flush=True)  # fmt: skip
    client.flushall()
    wide_baseline = int(client.info("memory")["used_memory"])
    inputs = parquet_inputs(work / "wide", ("accounts", "group_members"))
    wide_file = bench.job_file("wide", inputs, work / "wide-state", data.WIDE_QUERY)
    bench.run(f"full, wide {wide_listeners:,}, Parquet", wide_file)
    return memory(client, wide_baseline, wide_listeners)


def index_ab(bench: Bench, pairs: int) -> None:
    """Full runs from Parquet with the audience index and without, alternating: their wall
    times, and the index's Redis memory per listener-criterion pair."""
    from bow_gateway.core.audience_layout import IndexLayout, IndexPointer

    client, work = bench.client, bench.work
    with_index = bench.job_file("indexed", parquet_inputs(work / "parquet"), work / "ab-state")
    without = work / "unindexed.toml"
    without.write_text(with_index.read_text() + "[index]\nenabled = false\n")
    walls: dict[bool, list[float]] = {True: [], False: []}
    per_pair: list[float] = []
    for turn in range(2 * pairs):
        indexed = turn % 2 == 0
        client.flushall()
        baseline = int(client.info("memory")["used_memory"])
        result = bench.run("full, Parquet, " + ("with" if indexed else "without") + " the index",
                           with_index if indexed else without)  # fmt: skip
        walls[indexed].append(result["wall"])
        if indexed:
            layout = IndexLayout(NAMESPACE)
            pointer = IndexPointer.from_json(client.get(layout.pointer_key))
            assert pointer is not None
            used = sum(
                int(client.memory_usage(key, samples=0) or 0)
                for key in client.scan_iter(match=layout.prefix(pointer.generation) + "*")
            )
            per_pair.append(used / max(1, pointer.members))
            grew = int(client.info("memory")["used_memory"]) - baseline
            print(
                f"  index: {pointer.members:,} listener-criterion pairs in {pointer.pairs:,}"
                f" bitmaps, {used / 1e6:.1f} MB (MEMORY USAGE): {per_pair[-1]:.2f} B per pair;"
                f" used_memory grew {grew / 1e6:.1f} MB in all (criteria too)",
                flush=True,
            )
    ratio = statistics.median(walls[True]) / statistics.median(walls[False])
    print(
        f"\naudience index A/B ({pairs} pairs): wall with {walls[True]}, without {walls[False]};"
        f" median ratio {ratio:.3f} (target <= 1.25); {statistics.median(per_pair):.2f} B per"
        " listener-criterion pair (target <= 12)"
    )


def print_memory(
    listeners: int, used: dict[str, Any], wide_listeners: int, wide_used: dict[str, Any] | None
) -> None:
    print(
        f"\nmemory per listener (live snapshot of {listeners:,}): {used['used']:.1f} B"
        f" (used_memory); sampled buckets: {used['usage']:.1f} B in Redis for"
        f" {used['payload']:.1f} B of field + value; encodings {used['encodings']}"
    )
    if wide_used is not None:
        print(
            f"memory per listener (wide, {wide_listeners:,}): {wide_used['used']:.1f} B"
            f" (used_memory); sampled buckets: {wide_used['usage']:.1f} B in Redis for"
            f" {wide_used['payload']:.1f} B of field + value; encodings {wide_used['encodings']}"
        )


if __name__ == "__main__":
    main()
