"""The criteria job on a real Spark standalone cluster: a master and two workers (one core each)
started from pyspark's own ``spark-class`` on loopback. The same job file, run by the command
line with ``--master spark://127.0.0.1:PORT`` and with ``--master local[2]`` into another Redis
and namespace, must leave the same snapshot, after a full run and after an incremental one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from criteria_data import QUERY, churn, expected_criteria, generate, write_parquet

from bow_gateway.core.audience_layout import IndexLayout, IndexPointer
from bow_gateway.core.criteria_snapshot import Layout, Live, id_field, parse_change
from bow_gateway.job.config import load_job_config, parse_job_config
from bow_gateway.job.spark import APP_NAME, executor_python

from .support.redis_server import RedisServer
from .support.served import BOW_GATEWAY
from .support.spark_standalone import SparkStandalone, spark_environment

LISTENERS = 2000
NAMES = ("users", "roles", "memberships")
# Three JVM daemons, two executors, four runs of the command line (each a JVM): on 2 cores.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    with SparkStandalone(tmp_path_factory.mktemp("spark"), workers=2, cores=1) as started:
        yield started


def job_file(folder: Path, server: RedisServer, namespace: str, data: Path) -> Path:
    """The job file of one side: its Redis, namespace and state; the same Spark settings."""
    document = {
        "redis": {"url": server.url, "namespace": namespace},
        "inputs": [
            {"name": n, "format": "parquet", "path": str(data / f"{n}.parquet")} for n in NAMES
        ],
        "criteria": {"query": QUERY},
        "snapshot": {"state_dir": str(folder / "state"), "grace_seconds": 30},
        "spark": {
            # made by the first run (on the cluster: the driver's JVM), then used by the others
            "class_archive": str(folder.parent / "spark.jsa"),
            "conf": {
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "4",
                "spark.executor.memory": "512m",
                # the executors' Python: the job file's setting, not an environment variable
                "spark.pyspark.python": sys.executable,
            },
        },
    }
    path = folder / f"{namespace}-{data.name}.toml"
    path.write_text(_toml(document))
    assert load_job_config(str(path)).spark_conf == document["spark"]["conf"]  # type: ignore[index]
    return path


def _toml(document: dict[str, Any], table: str = "") -> str:
    """Just enough TOML for the job file (strings, numbers, tables, arrays of tables)."""
    lines, nested = [], []
    for key, value in document.items():
        name = f"{table}.{key}" if table else key
        if isinstance(value, dict):
            nested.append(f"[{name}]\n" + _toml(value, name))
        elif isinstance(value, list):
            nested.extend(f"[[{name}]]\n" + _toml(item, name) for item in value)
        else:
            lines.append(f"{json.dumps(key)} = {json.dumps(value)}")
    return "\n".join(lines) + "\n" + "".join(nested)


def run_command(config: Path, master: str, folder: Path, incremental: bool = False) -> str:
    """``bow-gateway criteria-job`` in a process of its own; its summary."""
    environment = spark_environment(folder)
    environment.pop("PYSPARK_PYTHON", None)  # the job file says which Python
    command = [*BOW_GATEWAY, "criteria-job", "--config", str(config)]
    command += ["--master", master, *(["--incremental"] if incremental else [])]
    done = subprocess.run(
        command, env=environment, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stderr[-4000:]}"
    return done.stdout


def snapshot(client: redis.Redis, namespace: str) -> dict[str, Any]:
    """What the job left in Redis, with the names that differ between runs replaced."""
    layout = Layout(namespace)
    live = Live.from_json(client.get(layout.live_key))
    assert live is not None

    index = IndexPointer.from_json(client.get(IndexLayout(namespace).pointer_key))
    assert index is not None

    def same(key: bytes) -> str:
        text = key.decode().replace(namespace, "NS").replace(live.snapshot, "SNAPSHOT")
        return text.replace(f":audience:{index.generation}:", ":audience:LIVE:")

    def earlier(key: bytes) -> bool:
        """A key of an audience index generation in its grace: gone sooner or later."""
        return b":audience:" in key and f":audience:{index.generation}:".encode() not in key

    return {
        "keys": sorted(same(key) for key in client.scan_iter("*") if not earlier(key)),
        "live": (live.buckets, live.keys, live.codes, live.state is not None),
        "buckets": {
            bucket: client.hgetall(layout.bucket_key(live.snapshot, bucket))
            for bucket in range(live.buckets)
        },
        "encodings": {
            client.object("encoding", layout.bucket_key(live.snapshot, bucket))
            for bucket in range(live.buckets)
        },
    }


def notified(listening: Any) -> set[Any]:
    heard: set[Any] = set()
    while (message := listening.get_message(timeout=1)) is not None:
        if message["type"] == "message":
            heard.update(parse_change(message["data"]) or [])
    return heard


def test_the_job_on_a_standalone_cluster_leaves_the_snapshot_a_local_run_leaves(
    cluster: SparkStandalone, tmp_path: Path
) -> None:
    dataset = generate(LISTENERS, seed=17)
    changed, _ = churn(dataset, 0.05, seed=4)
    write_parquet(dataset, tmp_path / "first")
    write_parquet(changed, tmp_path / "changed")
    sides = {"standalone": cluster.url, "local": "local[2]"}
    config = {"hash-max-listpack-value": 512}
    with RedisServer(config=config) as one, RedisServer(config=config) as other:
        servers = dict(zip(sides, (one, other), strict=True))
        clients = {side: redis.Redis.from_url(servers[side].url) for side in sides}
        try:
            for side, master in sides.items():
                folder = tmp_path / side
                folder.mkdir()
                path = job_file(folder, servers[side], side, tmp_path / "first")
                assert "full run done" in run_command(path, master, folder)
            full = {side: snapshot(clients[side], side) for side in sides}
            assert full["standalone"] == full["local"]
            assert full["local"]["encodings"] == {b"listpack"}
            live = Live.from_json(clients["local"].get(Layout("local").live_key))
            assert live is not None
            as_read = {
                field.decode(): live.criteria(value)
                for bucket in full["local"]["buckets"].values()
                for field, value in bucket.items()
            }
            assert as_read == {id_field(i): c for i, c in expected_criteria(dataset).items()}

            heard = {}
            for side, master in sides.items():
                listening = clients[side].pubsub()  # type: ignore[no-untyped-call]
                listening.subscribe(Layout(side).changes_channel)
                path = job_file(tmp_path / side, servers[side], side, tmp_path / "changed")
                summary = run_command(path, master, tmp_path / side, incremental=True)
                assert "incremental run done" in summary
                heard[side] = notified(listening)
                listening.close()
            after = {side: snapshot(clients[side], side) for side in sides}
            assert after["standalone"] == after["local"]
            assert heard["standalone"] == heard["local"] != set()
            assert after["local"]["buckets"] != full["local"]["buckets"]
        finally:
            for client in clients.values():
                client.close()

    # It ran on the cluster: the master recorded the two runs, each with a core of each worker.
    done = [app for app in cluster.state()["completedapps"] if app["name"] == APP_NAME]
    assert len(done) == 2 and all(app["cores"] == 2 for app in done)
    for work_dir in cluster.work_dirs:  # an executor of each run on each worker
        assert {app["id"] for app in done} <= {p.name for p in work_dir.iterdir()}


def test_executors_whose_python_lacks_pyarrow_fail_naming_that_python(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # a Python without the spark extra
    with RedisServer() as server:
        path = tmp_path / "job.toml"
        path.write_text(
            f'[redis]\nurl = "{server.url}"\n[criteria]\nquery = "SELECT 1 AS id, true AS on"\n'
            f'[spark.conf]\n"spark.ui.enabled" = "false"\n'
            f'"spark.pyspark.python" = "{bare}/bin/python"\n'
        )
        command = [*BOW_GATEWAY, "criteria-job", "--config", str(path)]
        command += ["--master", "local[1]"]
        done = subprocess.run(
            command, env=spark_environment(tmp_path), capture_output=True, text=True, timeout=240
        )
    assert done.returncode == 1
    failure = done.stderr.strip().splitlines()[-1]
    assert failure.startswith("criteria-job: failed: Spark failed: ModuleNotFoundError:")
    assert f"executors' Python, {bare}/bin/python: install the spark extra" in failure


def test_the_executors_python_is_the_job_file_s_then_the_environment_s() -> None:
    def config(**conf: str) -> Any:
        document = {"redis": {"url": "redis://x"}, "criteria": {"query": "q"}}
        return parse_job_config({**document, "spark": {"conf": conf}})

    chosen = {"spark.pyspark.python": "/opt/a/python"}
    environ = {"PYSPARK_PYTHON": "/opt/b/python"}
    assert executor_python(config(**chosen), local=False, environ=environ) == "/opt/a/python"
    assert executor_python(config(), local=False, environ=environ) == "/opt/b/python"
    assert executor_python(config(), local=True, environ={}) == sys.executable
    assert executor_python(config(), local=False, environ={}) is None  # Spark's python3
    assert os.path.isabs(sys.executable)
