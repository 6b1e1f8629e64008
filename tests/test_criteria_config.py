"""The criteria job's file: every mistake is named by its field; the shipped examples load."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from bow_gateway.job.config import ConfigError, load_job_config, parse_job_config
from bow_gateway.job.spark import driver_java_options, local_cores, short
from bow_gateway.runtime.redis_client import redacted

ROOT = Path(__file__).resolve().parent.parent
ENV = {"BOW_REDIS_URL": "redis://127.0.0.1:6379/0", "APP_DB_PASSWORD": "secret"}


def document(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "redis": {"url": "redis://127.0.0.1:6379/0"},
        "inputs": [{"name": "users", "format": "parquet", "path": "users.parquet"}],
        "criteria": {"query": "SELECT id FROM users"},
    }
    base.update(changes)
    return base


def jdbc(**options: Any) -> dict[str, Any]:
    return {
        "name": "users",
        "format": "jdbc",
        "url": "jdbc:postgresql://db/app",
        "table": "u",
        **options,
    }


def test_defaults_and_jdbc_options() -> None:
    config = parse_job_config(
        document(
            inputs=[
                jdbc(
                    user="app",
                    password_env="APP_DB_PASSWORD",
                    partition_column="id",
                    lower_bound=1,
                    upper_bound=10,
                    num_partitions=2,
                    fetch_size=500,
                )
            ]
        ),
        ENV,
    )
    assert config.namespace == "bow" and config.listeners_per_bucket == 100
    assert config.grace_seconds == 60 and config.state_dir is None and config.master is None
    assert config.inputs[0].options == {
        "url": "jdbc:postgresql://db/app",
        "dbtable": "u",
        "user": "app",
        "fetchsize": "500",
        "driver": "org.postgresql.Driver",
        "password": "secret",
        "partitionColumn": "id",
        "lowerBound": "1",
        "upperBound": "10",
        "numPartitions": "2",
    }
    query = parse_job_config(document(inputs=[jdbc(table=None, query="SELECT 1")]), ENV)
    assert query.inputs[0].options["dbtable"] == "(SELECT 1) AS bow_input"


@pytest.mark.parametrize(
    ("connection", "settings"),
    [
        ({"host": "10.0.0.5", "port": 6380}, {"host": "10.0.0.5", "port": 6380, "password": "pw"}),
        (
            {"sentinels": ["s1:26379"], "service_name": "main"},
            {"sentinels": ["s1:26379"], "service_name": "main", "password": "pw"},
        ),
        (
            [{"host": "node1", "port": 7000}, {"host": "node2", "port": 7000}],
            [
                {"host": "node1", "port": 7000, "password": "pw"},
                {"host": "node2", "port": 7000, "password": "pw"},
            ],
        ),
    ],
    ids=["mapping", "sentinel", "cluster"],
)
def test_a_redis_connection_takes_every_form_the_gateway_takes(
    connection: Any, settings: Any
) -> None:
    redis = {"connection": connection, "password_env": "REDIS_PASSWORD"}
    config = parse_job_config(document(redis=redis), {"REDIS_PASSWORD": "pw"})
    assert config.redis == settings


def test_relative_paths_are_taken_from_the_file_s_folder(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        '[redis]\nurl = "redis://x"\n[[inputs]]\nname = "u"\nformat = "csv"\n'
        'path = ["a.csv", "/abs/b.csv", "s3a://bucket/c.csv"]\noptions = { header = true }\n'
        '[criteria]\nquery = "SELECT 1 AS id"\n[snapshot]\nstate_dir = "state"\n'
    )
    config = load_job_config(str(path))
    assert config.inputs[0].paths == (str(tmp_path / "a.csv"), "/abs/b.csv", "s3a://bucket/c.csv")
    assert config.inputs[0].options == {"header": "true"}
    assert config.state_dir == str(tmp_path / "state")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (
            {"redis": {}},
            "redis.url: not set, and neither is the environment variable BOW_REDIS_URL",
        ),
        ({"redis": {"url_env": "NOPE"}}, "NOPE"),
        ({"redis": {"url": "redis://x", "host": "y"}}, "redis.host: unknown setting"),
        (
            {"redis": {"url": "redis://x", "connection": {"host": "y"}}},
            r"redis.connection: give either a url \(or url_env\) or a connection",
        ),
        ({"redis": {"connection": []}}, "redis.connection: must be a redis:// URL"),
        ({"redis": {"connection": {"sentinels": ["s:1"]}}}, 'needs "service_name"'),
        ({"redis": {"connection": {"host": "y"}, "password_env": "NOPE"}}, "NOPE is not set"),
        ({"redis": {"url": "redis://x", "password_env": "P"}}, "only for a connection"),
        ({"criteria": {}}, "criteria.query: must be a non-empty string"),
        ({"criteria": None}, "criteria: a table is required"),
        ({"inputs": {"name": "x"}}, r"inputs: must be an array of tables"),
        ({"inputs": [{"name": "bad name", "format": "csv", "path": "x"}]}, r"inputs\[0\].name"),
        ({"inputs": [{"name": "x", "format": "avro", "path": "x"}]}, r"inputs\[0\].format"),
        ({"inputs": [{"name": "x", "format": "csv"}]}, r"inputs\[0\].path"),
        (
            {"inputs": [{"name": "x", "format": "csv", "path": "a", "table": "t"}]},
            r"inputs\[0\].table: unknown setting",
        ),
        ({"inputs": [jdbc(), jdbc()]}, "the view name 'users' is used twice"),
        ({"inputs": [jdbc(table=None)]}, r"inputs\[0\].table: give either table or query"),
        ({"inputs": [jdbc(query="x")]}, r"inputs\[0\].table: give either table or query"),
        ({"inputs": [jdbc(partition_column="id")]}, "also need lower_bound, upper_bound"),
        ({"inputs": [jdbc(password_env="UNSET_VARIABLE")]}, "UNSET_VARIABLE is unset"),
        ({"inputs": [jdbc(jar="/no/such.jar")]}, "no such file /no/such.jar"),
        ({"snapshot": {"buckets": 0}}, "snapshot.buckets: must be a whole number >= 1"),
        ({"snapshot": {"grace_seconds": -1}}, "snapshot.grace_seconds"),
        ({"snapshot": {"listeners_per_bucket": 1.5}}, "snapshot.listeners_per_bucket"),
        ({"spark": {"conf": {"a": [1]}}}, "spark.conf.a: must be a string"),
        ({"sparks": {}}, "sparks: unknown setting"),
    ],
)
def test_mistakes_are_named(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        parse_job_config(document(**changes), {})


def test_unreadable_or_invalid_files_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_job_config(str(tmp_path / "missing.toml"))
    (tmp_path / "bad.toml").write_text("[redis\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_job_config(str(tmp_path / "bad.toml"))


def test_the_shipped_job_files_load(tmp_path: Path) -> None:
    example = load_job_config(str(ROOT / "deploy/criteria-job.example.toml"), ENV)
    assert [i.name for i in example.inputs] == ["users", "roles", "memberships"]
    assert example.redis == ENV["BOW_REDIS_URL"]
    # the job.toml of deploy/kubernetes/cronjob.yaml's ConfigMap
    manifest = (ROOT / "deploy/kubernetes/cronjob.yaml").read_text()
    block = manifest.split("  job.toml: |\n", 1)[1].split("\n---", 1)[0]
    (tmp_path / "job.toml").write_text(re.sub(r"(?m)^    ", "", block))
    job = load_job_config(str(tmp_path / "job.toml"), ENV)
    assert "collect_set" in job.query and job.inputs[0].options["password"] == "secret"


def test_helpers() -> None:
    assert local_cores("local") == 1
    assert local_cores("local[3]") == 3
    assert local_cores("local[*]") == (os.cpu_count() or 1)
    assert local_cores("local[2, 4]") == 2
    assert local_cores("spark://host:7077") is None and local_cores(None) is None
    assert redacted("redis://user:pw@host:6379/0") == "redis://user:***@host:6379/0"
    assert redacted("redis://:pw@host") == "redis://:***@host"
    assert redacted("redis://host") == "redis://host"
    python = RuntimeError("boom\nTraceback (most recent call last):\n  x\nValueError: bad id\n")
    assert short(python) == "ValueError: bad id"
    assert short(RuntimeError("[X] a thing failed SQLSTATE: 42000; line 1")) == "[X] a thing failed"


def test_local_spark_defaults_merge_the_file_s_java_options(tmp_path: Path) -> None:
    from bow_gateway.job.spark import C2_DIRECTIVES, local_defaults

    config = parse_job_config(document(spark={"conf": {"spark.sql.shuffle.partitions": "3"}}))
    assert local_defaults(2, config, warm=False) == {
        "spark.sql.shuffle.partitions": "4",  # the file's 3 goes on top in build_session
        "spark.sql.execution.useObjectHashAggregateExec": "false",
        "spark.driver.extraJavaOptions": "-XX:+UseParallelGC -XX:+UnlockDiagnosticVMOptions"
        f" -XX:+DisplayVMOutputToStderr -XX:CompilerDirectivesFile={C2_DIRECTIVES}",
    }
    # on more cores, C2 compiles on cores the tasks leave free
    assert local_defaults(8, config)["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"
    archive = str(tmp_path / "spark.jsa")
    java = {"spark.driver.extraJavaOptions": "-XX:+UseG1GC -Xss4m -XX:-TieredCompilation"}
    config = parse_job_config(document(spark={"conf": java, "class_archive": archive}))
    options = local_defaults(2, config)["spark.driver.extraJavaOptions"]
    assert options == (
        f"-XX:+UseG1GC -Xss4m -XX:-TieredCompilation -XX:ArchiveClassesAtExit={archive}"
        " -Xlog:cds*=off"
    )
    Path(archive).write_bytes(b"")
    assert (
        f"-XX:SharedArchiveFile={archive}"
        in local_defaults(2, config)["spark.driver.extraJavaOptions"]
    )


def test_the_jvm_takes_the_compiler_directives_and_says_so_on_stderr_only() -> None:
    # The JVM refuses to start on directives it cannot parse; it announces those it read on
    # stdout, which is the job's own (its summary), unless told to use stderr.
    import shutil
    import subprocess

    from bow_gateway.job.spark import C2_DIRECTIVES

    java = shutil.which("java")
    assert java is not None, "the criteria job needs Java 17+ (tests/install-system-packages.sh)"
    options = driver_java_options(parse_job_config(document()), local=True, cores=2)
    run = subprocess.run(
        [java, *shlex.split(options), "-version"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""
    assert "2 compiler directives added" in run.stderr
    assert C2_DIRECTIVES.is_file()
