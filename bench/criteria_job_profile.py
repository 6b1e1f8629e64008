"""Where the criteria job's write phase goes: one run of the command line, profiled.

Run:  .venv/bin/pip install py-spy      # into the venv only: not a dependency of the project
      .venv/bin/python bench/criteria_job_profile.py --config job.toml [--out /tmp/job-profile]

It runs ``bow-gateway criteria-job --config FILE`` under py-spy (``--subprocesses --idle``: the
Python workers Spark forks, waits included) with a Java Flight Recorder recording of the driver
JVM (added to the file's ``spark.driver.extraJavaOptions`` in a copy of the job file), samples the
CPU seconds of the JVM, the Python workers and the job's ``redis-server`` (``--redis-pid``) from
``/proc`` every 0.25 s, then prints, for the write phase only (from the job's progress lines):
CPU seconds per kind of process, the workers' samples by what they were doing, and the JVM's
Java samples by what they were doing. Local mode only (the executors are this machine's).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import subprocess
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON_KINDS = [  # (what, a regular expression on the stack), first match wins
    ("the daemon waiting to fork", r"^(?!.*worker \(daemon\.py).*manager \(daemon\.py"),
    ("importing (pyspark from its zip, redis-py, pyarrow)", r"_find_and_load"),
    ("task set-up (importlib.invalidate_caches re-reads pyspark.zip)", r"invalidate_caches"),
    ("waiting for the next task", r"read_int|get_init_message"),
    ("waiting for Arrow batches from the JVM", r"load_stream"),
    ("waiting for Redis replies", r"read_response"),
    ("grouping rows by bucket (Arrow sort, take)", r"sort_indices|take \(|combine_chunks"),
    ("building and sending commands", r"_Writer\.write|_Pipe"),
]
JAVA_KINDS = [
    ("Spark measuring each Arrow batch after every row", r"sizeInBytes"),
    ("rows into Arrow batches", r"ArrowWriter|ArrowFieldWriter|arrow\.vector|writeNextBatch"),
    ("reading the cached query result", r"columnar"),
    ("the commands' bytes (concat, crc32)", r"GeneratedIterator|UTF8String|UnsafeWriter"),
    ("planning (driver)", r"antlr|catalyst\.analysis|catalyst\.optimizer|catalyst\.rules"),
]


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (children of every thread: the JVM forks from others)."""
    found = [pid]
    for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        try:
            children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        except OSError:
            continue
        for child in children:
            found += _tree(int(child))
    return found


def _cpu(pid: int) -> tuple[float, str] | None:
    """CPU seconds of a process so far, and its command line."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), command


def _sample(root: int, redis_pid: int | None, rows: list[tuple[float, dict[str, float]]]) -> None:
    """CPU seconds so far of the JVM, the Python workers and Redis, every 0.25 s until the end."""
    seen: dict[int, tuple[float, str]] = {}
    while os.path.exists(f"/proc/{root}"):
        for pid in _tree(root):
            if (got := _cpu(pid)) is not None and pid != root:
                seen[pid] = got
        kinds = {"JVM": 0.0, "Python workers": 0.0, "Redis": 0.0}
        for seconds, command in seen.values():
            if command.split(" ")[0].endswith("java"):
                kinds["JVM"] += seconds
            elif "pyspark.daemon" in command:  # the daemon and the workers it forks
                kinds["Python workers"] += seconds
        redis = _cpu(redis_pid) if redis_pid else None
        kinds["Redis"] = redis[0] if redis else 0.0
        rows.append((time.monotonic(), kinds))
        time.sleep(0.25)


def _kind(text: str, kinds: list[tuple[str, str]]) -> str:
    return next((name for name, pattern in kinds if re.search(pattern, text)), "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the job file")
    parser.add_argument("--out", default="/tmp/bow-job-profile", help="a folder for the files")
    parser.add_argument("--redis-pid", type=int, help="the redis-server the job writes to")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = Path(args.config).resolve()
    document = tomllib.loads(config.read_text())
    java = document.get("spark", {}).get("conf", {}).get("spark.driver.extraJavaOptions", "")
    recording = f"-XX:StartFlightRecording=filename={out}/job.jfr,settings=profile"
    text = config.read_text()
    line = f'"spark.driver.extraJavaOptions" = "{(java + " " + recording).strip()}"'
    if java:
        text = re.sub(r'"spark\.driver\.extraJavaOptions"\s*=\s*"[^"]*"', line, text)
    elif "[spark.conf]" in text:
        text = text.replace("[spark.conf]", f"[spark.conf]\n{line}", 1)
    else:
        text += f"\n[spark.conf]\n{line}\n"
    profiled = config.parent / f".{config.stem}-profiled.toml"  # relative paths still resolve
    profiled.write_text(text)
    spy = [str(ROOT / ".venv/bin/py-spy"), "record", "--subprocesses", "--idle", "--rate", "50"]
    spy += ["--format", "raw", "-o", str(out / "job.spy"), "--"]
    job = [str(ROOT / ".venv/bin/bow-gateway"), "criteria-job", "--config", str(profiled)]
    started = time.monotonic()
    with open(out / "stderr.txt", "w") as err:
        process = subprocess.Popen(spy + job, stdout=subprocess.PIPE, stderr=err, text=True)
        rows: list[tuple[float, dict[str, float]]] = []
        sampler = threading.Thread(target=_sample, args=(process.pid, args.redis_pid, rows))
        sampler.start()
        summary, _ = process.communicate()
        sampler.join()
    profiled.unlink()
    print(summary)
    lines = (out / "stderr.txt").read_text().splitlines()
    progress = (re.match(r"\[\s*([\d.]+) s\] (.*)", x) for x in lines)
    marks = [(float(m[1]), m[2]) for m in progress if m]
    begin = next(i for i, (_, text) in enumerate(marks) if text.startswith("writing"))
    (first, text), (last, _) = marks[begin], marks[begin + 1]
    print(f"write phase: {last - first:.1f} s ({text})")
    at = [min(rows, key=lambda r: abs(r[0] - started - t))[1] for t in (first, last)]
    print("CPU seconds: " + ", ".join(f"{k} {at[1][k] - at[0][k]:.1f}" for k in at[0]))
    _python_kinds(out / "job.spy")
    _java_kinds(out / "job.jfr", text, last - first)


def _python_kinds(path: Path) -> None:
    """The Python workers' samples (idle included) by what they were doing, for the whole run
    (the workers run only in the write phase)."""
    kinds: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if "pyspark.daemon" in stack:
            frames = stack.split(";")
            last = max(i for i, f in enumerate(frames) if f.startswith("process "))
            kinds[_kind(";".join(frames[last + 1 :]), PYTHON_KINDS)] += int(samples)
    total = sum(kinds.values()) or 1
    print(f"Python worker processes: {total / 50:.1f} s sampled (idle included)")
    for name, count in kinds.most_common():
        print(f"  {count / 50:6.1f} s {count / total:6.1%}  {name}")


def _java_kinds(path: Path, writing: str, seconds: float) -> None:
    """The JVM's Java samples in the write phase (from the snapshot id's UTC time) by kind."""
    printed = subprocess.run(
        ["jfr", "print", "--json", "--events", "jdk.ExecutionSample", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    stamp = re.search(r"(\d{8}T\d{6}Z)", writing)
    if stamp is None:  # an incremental run writes into the live snapshot: no new id to time
        print("JVM: the write phase's start is not known (an incremental run)")
        return
    parsed = datetime.datetime.strptime(stamp[1], "%Y%m%dT%H%M%SZ")
    start = parsed.replace(tzinfo=datetime.UTC).timestamp()
    kinds: collections.Counter[str] = collections.Counter()
    for event in json.loads(printed)["recording"]["events"]:
        values: dict[str, Any] = event["values"]
        when = datetime.datetime.fromisoformat(values["startTime"]).timestamp()
        if start <= when <= start + seconds + 1:
            frames = values["stackTrace"]["frames"]
            names = ";".join(f"{f['method']['type']['name']}.{f['method']['name']}" for f in frames)
            kinds[_kind(names, JAVA_KINDS)] += 1
    total = sum(kinds.values()) or 1
    print(f"JVM: {total} Java samples in the write phase")
    for name, count in kinds.most_common():
        print(f"  {count:6} {count / total:6.1%}  {name}")


if __name__ == "__main__":
    main()
