"""The criteria job's TOML file, checked field by field.

::

    [redis]
    url = "redis://127.0.0.1:6379/0"   # or url_env = "BOW_REDIS_URL" (the default), or
    # connection = { host = "10.0.0.5", port = 6379 }: redis-py settings, Sentinel's
    # ({ sentinels = ["s1:26379"], service_name = "mymaster" }) or cluster nodes
    # ([{ host = "node1", port = 7000 }, ...]), as the gateway's `redis` setting takes them;
    # password_env = "REDIS_PASSWORD" adds their password from the environment
    namespace = "bow"                  # the gateway's namespace

    [spark]                            # optional
    master = "local[*]"                # --master overrides it
    conf = { "spark.driver.memory" = "2g" }
    class_archive = "/var/cache/bow-gateway/spark.jsa"   # a faster start of the driver JVM

    [[inputs]]                         # each one becomes a Spark SQL view named `name`
    name = "users"
    format = "jdbc"                    # jdbc, parquet, csv or json
    url = "jdbc:postgresql://127.0.0.1:5432/app"
    table = "users"                    # or query = "SELECT ..."
    user = "app"
    password_env = "APP_DB_PASSWORD"   # or password = "..."
    jar = "/usr/share/java/postgresql.jar"
    partition_column = "id"            # optional, with lower_bound, upper_bound, num_partitions
    lower_bound = 1
    upper_bound = 1000000
    num_partitions = 4

    [[inputs]]
    name = "memberships"
    format = "parquet"                 # csv and json alike; options = { header = true }
    path = "/data/memberships.parquet"

    [criteria]
    query = "SELECT u.id, u.plan, collect_set(m.role) AS role FROM users u ... GROUP BY ..."

    [snapshot]                         # optional
    listeners_per_bucket = 100
    grace_seconds = 60
    lock_seconds = 60
    state_dir = "/var/lib/bow-gateway/criteria-state"   # needed by --incremental

    [index]                            # optional: the audience index (docs/criteria-job.md)
    enabled = true
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ..runtime.redis_client import RedisSettings, check_settings

FORMATS: Final = ("jdbc", "parquet", "csv", "json")
DEFAULT_REDIS_ENV: Final = "BOW_REDIS_URL"
DRIVERS: Final = {
    "postgresql": "org.postgresql.Driver",
    "mysql": "com.mysql.cj.jdbc.Driver",
    "mariadb": "org.mariadb.jdbc.Driver",
    "sqlserver": "com.microsoft.sqlserver.jdbc.SQLServerDriver",
}
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SCALAR: Final = (str, int, float, bool)


class ConfigError(ValueError):
    """The job's configuration is invalid: the message names the field."""


@dataclass(frozen=True)
class Input:
    """One ``[[inputs]]`` table: a Spark SQL view read with ``format`` and ``options``."""

    name: str
    format: str
    options: dict[str, str]
    paths: tuple[str, ...] = ()
    schema: str | None = None
    jar: str | None = None


@dataclass(frozen=True)
class JobConfig:
    """The whole file."""

    redis: RedisSettings
    """A URL, a mapping of connection settings (Sentinel's too), or cluster nodes."""
    namespace: str
    query: str
    inputs: tuple[Input, ...]
    master: str | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    class_archive: str | None = None
    listeners_per_bucket: int = 100
    buckets: int | None = None
    grace_seconds: float = 60.0
    lock_seconds: float = 60.0
    state_dir: str | None = None
    notify_chunk: int = 1000
    index_enabled: bool = True

    @property
    def jars(self) -> list[str]:
        return [i.jar for i in self.inputs if i.jar is not None]


def load_job_config(path: str, environ: Mapping[str, str] = os.environ) -> JobConfig:
    """Read and check a job file; :class:`ConfigError` names the bad field."""
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML: {error}") from None
    return parse_job_config(document, environ, base=Path(path).resolve().parent)


def parse_job_config(
    document: Mapping[str, Any], environ: Mapping[str, str] = os.environ, base: Path | None = None
) -> JobConfig:
    """Check a parsed job file (relative paths are taken from ``base``)."""
    _only(document, "", {"redis", "spark", "inputs", "criteria", "snapshot", "index"})
    redis = _table(document, "redis")
    _only(redis, "redis.", {"url", "url_env", "connection", "password_env", "namespace"})
    settings = _redis_settings(redis, environ)
    spark = _table(document, "spark")
    _only(spark, "spark.", {"master", "conf", "class_archive"})
    conf = _table(spark, "conf", "spark.conf")
    criteria = _table(document, "criteria", required=True)
    _only(criteria, "criteria.", {"query"})
    raw_inputs = document.get("inputs", [])
    if not isinstance(raw_inputs, list) or not all(isinstance(t, dict) for t in raw_inputs):
        raise ConfigError("inputs: must be an array of tables ([[inputs]])")
    inputs = tuple(_input(t, f"inputs[{n}].", environ, base) for n, t in enumerate(raw_inputs))
    names = [i.name.lower() for i in inputs]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"inputs: the view name {name!r} is used twice")
    snapshot = _table(document, "snapshot")
    _only(
        snapshot,
        "snapshot.",
        {
            "listeners_per_bucket",
            "buckets",
            "grace_seconds",
            "lock_seconds",
            "state_dir",
            "notify_chunk",
        },
    )
    index = _table(document, "index")
    _only(index, "index.", {"enabled"})
    if not isinstance(index.get("enabled", True), bool):
        raise ConfigError("index.enabled: must be true or false")
    return JobConfig(
        redis=settings,
        namespace=_str(redis, "namespace", "redis.namespace", required=False) or "bow",
        query=_str(criteria, "query", "criteria.query", required=True),  # type: ignore[arg-type]
        inputs=inputs,
        master=_str(spark, "master", "spark.master", required=False),
        spark_conf={str(k): _conf_value(v, f"spark.conf.{k}") for k, v in conf.items()},
        class_archive=_optional_path(spark, "class_archive", "spark.class_archive", base),
        listeners_per_bucket=_number(snapshot, "listeners_per_bucket", 100, 1, integer=True),
        buckets=_number(snapshot, "buckets", None, 1, integer=True),
        grace_seconds=_number(snapshot, "grace_seconds", 60.0, 0),
        lock_seconds=_number(snapshot, "lock_seconds", 60.0, 3),
        state_dir=_optional_path(snapshot, "state_dir", "snapshot.state_dir", base),
        notify_chunk=_number(snapshot, "notify_chunk", 1000, 1, integer=True),
        index_enabled=index.get("enabled", True),
    )


def _redis_settings(redis: Mapping[str, Any], environ: Mapping[str, str]) -> RedisSettings:
    """``url``, or ``connection`` (with ``password_env``), or the URL in ``url_env``."""
    connection = redis.get("connection")
    if connection is not None:
        if "url" in redis or "url_env" in redis:
            raise ConfigError("redis.connection: give either a url (or url_env) or a connection")
        try:
            settings = check_settings(connection)
        except ValueError as error:
            raise ConfigError(f"redis.connection: {error}") from None
        variable = _str(redis, "password_env", "redis.password_env", required=False)
        if variable is None:
            return settings
        password = environ.get(variable) or None
        if password is None:
            raise ConfigError(f"redis.password_env: the environment variable {variable} is not set")
        if isinstance(settings, list):
            return [{**node, "password": password} for node in settings]
        assert isinstance(settings, dict)
        return {**settings, "password": password}
    if "password_env" in redis:
        raise ConfigError("redis.password_env: only for a connection (a URL holds its password)")
    url = _str(redis, "url", "redis.url", required=False)
    if url is None:
        name = _str(redis, "url_env", "redis.url_env", required=False) or DEFAULT_REDIS_ENV
        url = environ.get(name) or None
        if url is None:
            raise ConfigError(f"redis.url: not set, and neither is the environment variable {name}")
    return url


def _input(
    table: dict[str, Any], where: str, environ: Mapping[str, str], base: Path | None
) -> Input:
    name = _str(table, "name", where + "name", required=True)
    assert name is not None
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{where}name: {name!r} is not a valid view name (letters, digits, _)")
    kind = _str(table, "format", where + "format", required=True)
    if kind not in FORMATS:
        raise ConfigError(f"{where}format: must be one of {', '.join(FORMATS)}, not {kind!r}")
    extra = _table(table, "options", where + "options")
    options = {str(k): _conf_value(v, f"{where}options.{k}") for k, v in extra.items()}
    if kind != "jdbc":
        return _file_input(table, where, base, name, kind, options)
    return _jdbc_input(table, where, environ, base, name, options)


def _file_input(
    table: dict[str, Any],
    where: str,
    base: Path | None,
    name: str,
    kind: str,
    options: dict[str, str],
) -> Input:
    """A Parquet, CSV or JSON input: its paths, and its schema."""
    _only(table, where, {"name", "format", "path", "schema", "options"})
    raw = table.get("path")
    paths = [raw] if isinstance(raw, str) else raw
    if not paths or not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise ConfigError(f"{where}path: a path or a list of paths is required")
    schema = _str(table, "schema", where + "schema", required=False)
    return Input(name, kind, options, tuple(_path(p, base) for p in paths), schema)


def _jdbc_input(
    table: dict[str, Any],
    where: str,
    environ: Mapping[str, str],
    base: Path | None,
    name: str,
    options: dict[str, str],
) -> Input:
    """A JDBC input: its URL, a table or a query, the credentials, the driver, the partitions."""
    _only(
        table,
        where,
        {
            "name",
            "format",
            "url",
            "table",
            "query",
            "user",
            "password",
            "password_env",
            "driver",
            "jar",
            "partition_column",
            "lower_bound",
            "upper_bound",
            "num_partitions",
            "fetch_size",
            "options",
        },
    )
    options["url"] = _str(table, "url", where + "url", required=True)  # type: ignore[assignment]
    source, query = table.get("table"), table.get("query")
    if (source is None) == (query is None):
        raise ConfigError(f"{where}table: give either table or query")
    if source is not None:
        options["dbtable"] = _str(table, "table", where + "table", required=True) or ""
    else:
        text = _str(table, "query", where + "query", required=True) or ""
        options["dbtable"] = f"({text}) AS bow_input"  # partitionable, unlike Spark's `query`
    for key, option in (("user", "user"), ("driver", "driver"), ("fetch_size", "fetchsize")):
        if key in table:
            options[option] = _conf_value(table[key], where + key)
    scheme = options["url"].split(":")[1] if options["url"].count(":") > 1 else ""
    if "driver" not in options and scheme in DRIVERS:
        # Spark finds a driver of spark.jars only by its class name, not through the URL.
        options["driver"] = DRIVERS[scheme]
    if "password" in table:
        options["password"] = _str(table, "password", where + "password", required=True) or ""
    elif "password_env" in table:
        variable = _str(table, "password_env", where + "password_env", required=True) or ""
        if variable not in environ:
            raise ConfigError(f"{where}password_env: the environment variable {variable} is unset")
        options["password"] = environ[variable]
    _partitioning(table, where, options)
    jar = _str(table, "jar", where + "jar", required=False)
    if jar is not None:
        jar = _path(jar, base)
        if not os.path.isfile(jar):
            raise ConfigError(f"{where}jar: no such file {jar} (Debian: libpostgresql-jdbc-java)")
    return Input(name, "jdbc", options, jar=jar)


def _partitioning(table: dict[str, Any], where: str, options: dict[str, str]) -> None:
    """A partitioned JDBC read's options: all four, or none."""
    partitioning = ("partition_column", "lower_bound", "upper_bound", "num_partitions")
    given = [key for key in partitioning if key in table]
    if given and len(given) != len(partitioning):
        missing = ", ".join(k for k in partitioning if k not in given)
        raise ConfigError(f"{where}{given[0]}: partitioned reads also need {missing}")
    for key in given:
        spark_name = {
            "partition_column": "partitionColumn",
            "lower_bound": "lowerBound",
            "upper_bound": "upperBound",
            "num_partitions": "numPartitions",
        }[key]
        options[spark_name] = _conf_value(table[key], where + key)


def _only(table: Mapping[str, Any], where: str, allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(
                f"{where}{key}: unknown setting (allowed: {', '.join(sorted(allowed))})"
            )


def _table(
    parent: Mapping[str, Any], key: str, where: str | None = None, required: bool = False
) -> dict[str, Any]:
    value = parent.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where or key}: a table is required")
    return value


def _str(table: Mapping[str, Any], key: str, where: str, required: bool) -> str | None:
    value = table.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: must be a non-empty string")
    return value


def _number(
    table: Mapping[str, Any], key: str, default: Any, minimum: float, integer: bool = False
) -> Any:
    value = table.get(key, default)
    if value is None:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or not math.isfinite(value) or value < minimum:
        kind = "a whole number" if integer else "a finite number"
        raise ConfigError(f"snapshot.{key}: must be {kind} >= {minimum:g}, not {value!r}")
    return value


def _conf_value(value: Any, where: str) -> str:
    if not isinstance(value, _SCALAR):
        raise ConfigError(f"{where}: must be a string, a number or a boolean")
    return str(value).lower() if isinstance(value, bool) else str(value)


def _optional_path(table: Mapping[str, Any], key: str, where: str, base: Path | None) -> str | None:
    value = _str(table, key, where, required=False)
    return None if value is None else _path(value, base)


def _path(path: str, base: Path | None) -> str:
    if "://" in path or base is None or os.path.isabs(path):
        return path
    return str(base / path)
