"""The criteria job's PySpark daemon for local runs (bow_gateway/seams/spark_daemon/), started as
Spark starts a daemon: a fresh interpreter with pyspark.zip and py4j's zip first on its path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

import bow_gateway.seams
from bow_gateway.job.config import parse_job_config
from bow_gateway.job.spark import WARM_DAEMON, WORKER_PATH, local_defaults

pytestmark = pytest.mark.spark

FOLDER = Path(bow_gateway.seams.__file__).parent / "spark_daemon"  # as installed

PROBE = """
import json, sys, threading
import bow_spark_daemon
moved = bow_spark_daemon.prefer_installed_pyspark()
import pyspark.worker, redis
print(json.dumps({
    "moved": moved,
    "pyspark": pyspark.worker.__file__,
    "zips": [p for p in sys.path if p.endswith(".zip") and ("pyspark" in p or "py4j" in p)],
    "threads": threading.active_count(),
    "heavy": sorted(m for m in ("pyarrow", "pandas", "numpy") if m in sys.modules),
}))
"""


def test_the_daemon_imports_the_installed_pyspark_and_starts_no_thread_before_forking() -> None:
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = [str(lib / "pyspark.zip"), *map(str, sorted(lib.glob("py4j-*.zip")))]
    assert all(os.path.isfile(path) for path in zips)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([*zips, str(FOLDER)])}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = json.loads(done.stdout)
    assert found["moved"] is True
    assert ".zip" not in found["pyspark"]  # compiled once, from the installed package
    assert found["zips"] == []
    assert found["threads"] == 1  # a fork copies no thread: none may run yet
    assert found["heavy"] == []


def test_local_runs_use_it_unless_the_job_file_names_a_daemon_or_a_path() -> None:
    base = {"redis": {"url": "redis://unused"}, "criteria": {"query": "SELECT 1 AS id"}}
    defaults = local_defaults(2, parse_job_config(base))
    assert defaults["spark.python.daemon.module"] == WARM_DAEMON
    assert Path(defaults[WORKER_PATH]) == FOLDER
    for key in ("spark.python.daemon.module", WORKER_PATH):
        own = parse_job_config({**base, "spark": {"conf": {key: "x"}}})
        assert "spark.python.daemon.module" not in local_defaults(2, own)
    # another Python for the executors (spark.pyspark.python) may lack what it imports
    config = parse_job_config(base)
    assert "spark.python.daemon.module" not in local_defaults(2, config, warm=False)
