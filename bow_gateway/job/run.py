"""``bow-gateway criteria-job``: precompute every listener's criteria with Spark, swap them in live.

The inputs of the job file become Spark SQL views; one query returns a row per listener (an ``id``
column and one column per criterion); the executors write the rows to Redis in the layout of
:mod:`bow_gateway.criteria_snapshot`, pipelined, as a new snapshot that goes live with one ``SET``
and a notification. ``--incremental`` diffs each listener's criteria against the previous run's
digests (Parquet, in ``snapshot.state_dir``) and writes only what changed into the live snapshot.

``spark-submit`` runs it through the file :mod:`bow_gateway.criteria_job`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import IO, TYPE_CHECKING, Any, Final

from ..criteria_snapshot import Layout, Live, bucket_count
from ..redis_client import describe, sync_redis_client
from .config import ConfigError, JobConfig, load_job_config

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ..redis_client import SyncClient
    from .store import SnapshotStore

CONFIG_ENV: Final = "BOW_CRITERIA_JOB_CONFIG"
APP_NAME: Final = "bow-gateway criteria-job"
ARROW_BATCH: Final = 65_536
"""Rows per Arrow batch to the writers (the default, 10,000, costs more round trips)."""
JAVA_OPTIONS: Final = "spark.driver.extraJavaOptions"
CLIENT_DEFAULTS: Final = {"socket_timeout": 60, "socket_connect_timeout": 10}
"""redis-py settings of the job's clients (the driver's and the writers'), unless the file's."""


class CriteriaJobError(RuntimeError):
    """The job failed; the message says why (the live snapshot is untouched unless it says so)."""


@dataclass(frozen=True)
class Summary:
    """What a run did."""

    mode: str
    snapshot: str
    buckets: int
    read: int
    written: int
    removed: int
    seconds: float
    write_seconds: float

    @property
    def rate(self) -> float:
        """Listeners written (and removed) per second of the write phase."""
        return (self.written + self.removed) / self.write_seconds if self.write_seconds else 0.0

    def text(self) -> str:
        verb = "changed" if self.mode == "incremental" else "written"
        return "\n".join(
            [
                f"criteria job: {self.mode} run done, snapshot {self.snapshot} is live"
                f" ({self.buckets:,} buckets)",
                f"  listeners read     {self.read:>12,}",
                f"  {verb:<18} {self.written:>12,}",
                f"  removed            {self.removed:>12,}",
                f"  duration           {self.seconds:>12.1f} s"
                f"  ({self.read / self.seconds if self.seconds else 0:,.0f} listeners read/s)",
                f"  write phase        {self.write_seconds:>12.1f} s"
                f"  ({self.rate:,.0f} listeners/s)",
            ]
        )


class Progress:
    """Timestamped progress lines on stderr (or nowhere)."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.stream = stream
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        if self.stream is not None:
            elapsed = time.monotonic() - self.started
            print(f"[{elapsed:7.1f} s] {message}", file=self.stream, flush=True)


# -- Spark ---------------------------------------------------------------------------------------


def build_session(config: JobConfig, master: str | None = None) -> SparkSession:
    """A Spark session for the job: ``master`` > the file's > ``local[*]`` (unless spark-submit)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(APP_NAME)
    master = master or config.master
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
    conf = {
        "spark.ui.showConsoleProgress": str(sys.stderr.isatty()).lower(),
        # The query's result is cached once, read twice (checks, then writes): building the
        # cache uncompressed is faster, and it is gone at the end of the run.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }
    if config.jars:
        conf["spark.jars"] = ",".join(config.jars)
    cores = local_cores(master)
    if cores is not None:
        if not os.environ.get("PYSPARK_PYTHON"):
            os.environ["PYSPARK_PYTHON"] = sys.executable  # local workers: this venv's Python
        conf.update(local_defaults(cores, config))  # the file's Java options are merged in
    conf.update({k: v for k, v in config.spark_conf.items() if k not in conf or k != JAVA_OPTIONS})
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    quiet_spark(spark)
    return spark


def local_defaults(cores: int, config: JobConfig) -> dict[str, str]:
    """Settings for Spark on one machine (the job file's own ``spark.conf`` comes on top)."""
    java = config.spark_conf.get(JAVA_OPTIONS, "")
    options = [java] if java else []
    if not re.search(r"-XX:\+Use\w+GC", java):
        # G1's concurrent threads compete with the tasks on a small machine: a cold run of a
        # million listeners takes ~15% longer with it (2 cores).
        options.append("-XX:+UseParallelGC")
    if config.class_archive is not None:
        options.append(class_archive(config.class_archive))
    return {
        # Spark's 200 shuffle partitions cost seconds of task overhead on one machine.
        "spark.sql.shuffle.partitions": str(2 * cores),
        JAVA_OPTIONS: " ".join(options),
    }


def class_archive(path: str) -> str:
    """The JVM option that loads Spark's classes from an AppCDS archive, or makes it (at exit).

    A stale archive (another JDK or classpath) is ignored by the JVM, with a warning.
    """
    quiet = "-Xlog:cds*=off"  # making one lists every class it cannot archive, on stdout
    if os.path.isfile(path):
        return f"-XX:SharedArchiveFile={path} {quiet}"
    return f"-XX:ArchiveClassesAtExit={path} {quiet}"


def local_cores(master: str | None) -> int | None:
    """The cores of a ``local``, ``local[N]`` or ``local[*]`` master; ``None`` for a cluster."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master or "")
    if match is None:
        return None
    if match.group(1) in (None, ""):
        return 1
    return os.cpu_count() or 1 if match.group(1) == "*" else int(match.group(1))


def quiet_spark(spark: SparkSession) -> None:
    """Warnings only, and no ERROR dump of a bad query: the job reports it in one line."""
    spark.sparkContext.setLogLevel("WARN")
    try:
        jvm: Any = spark.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.OFF
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "SQLQueryContextLogger", level
        )
    except Exception:  # noqa: BLE001 - cosmetic: another log4j setup keeps its output
        pass


def register_inputs(spark: SparkSession, config: JobConfig) -> None:
    """Every ``[[inputs]]`` table as a temporary Spark SQL view."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    for source in config.inputs:
        reader = spark.read.format(source.format).options(**source.options)
        if source.schema is not None:
            reader = reader.schema(source.schema)
        try:
            frame = reader.load(list(source.paths)) if source.paths else reader.load()
        except (PySparkException, Py4JError) as error:
            raise CriteriaJobError(
                f"input {source.name!r}: cannot read it: {short(error)}"
            ) from None
        frame.createOrReplaceTempView(source.name)


def short(error: BaseException) -> str:
    """The useful line of a Spark or Py4J error (its first line, or a Python error's last)."""
    java = getattr(error, "java_exception", None)  # a Py4JJavaError: the Java exception's line
    text = str(java if java is not None else error).strip()
    python_errors = re.findall(r"^\s*(?:[\w.]+\.)?\w+(?:Error|Exception): .+$", text, re.M)
    if "Traceback (most recent call last)" in text and python_errors:
        return str(python_errors[-1]).strip()
    first = text.split("\n", 1)[0]
    first = re.sub(r"\s*SQLSTATE: \w+.*$", "", first)
    return str(first[:600])


# -- the run -------------------------------------------------------------------------------------


def run_job(
    config: JobConfig,
    spark: SparkSession,
    *,
    incremental: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Summary:
    """One run of the job; :class:`CriteriaJobError` when it fails (nothing switched then)."""
    import redis as redis_py
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    from .frame import CriteriaQueryError
    from .store import LockHeld, LockLost, SnapshotStore

    started = time.monotonic()
    client = sync_redis_client(config.redis, defaults=CLIENT_DEFAULTS)
    try:
        client.ping()
        with SnapshotStore(
            client, Layout(config.namespace), lock_seconds=config.lock_seconds
        ) as store:
            return _locked_run(
                config, spark, store, incremental, progress or Progress(None), started
            )
    except (LockHeld, LockLost, CriteriaQueryError) as error:
        raise CriteriaJobError(str(error)) from None
    except (redis_py.RedisError, redis_py.exceptions.RedisClusterException) as error:
        raise CriteriaJobError(f"Redis at {describe(config.redis)}: {error}") from None
    except (PySparkException, Py4JError) as error:
        raise CriteriaJobError(f"Spark failed: {short(error)}") from None
    finally:
        client.close()


def _locked_run(
    config: JobConfig,
    spark: SparkSession,
    store: SnapshotStore,
    incremental: bool,
    progress: Callable[[str], None],
    started: float,
) -> Summary:
    from pyspark import StorageLevel
    from pyspark.errors import PySparkException

    from .frame import criteria_keys, shape

    removed = store.clean_up()
    if removed:
        progress(f"removed what earlier runs left: snapshot(s) {', '.join(removed)}")
    live = store.live()
    if incremental and config.state_dir is None:
        raise CriteriaJobError("--incremental needs snapshot.state_dir in the job file")
    register_inputs(spark, config)
    progress(f"inputs: {', '.join(i.name for i in config.inputs) or 'none'}")
    try:
        frame = spark.sql(config.query)
    except PySparkException as error:
        raise CriteriaJobError(f"the criteria query is invalid: {short(error)}") from None
    keys = criteria_keys(frame)
    shaped = shape(frame).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        read = _check(shaped, store.client, config, distinct=incremental, progress=progress)
        if incremental and (live is None or live.state is None or not _exists(spark, live.state)):
            progress("no state of a previous run to compare with: a full run instead")
            incremental = False
        elif incremental and live is not None and live.keys != keys:
            progress("the query's criteria columns changed since the live snapshot: a full run")
            incremental = False
        if incremental:
            assert live is not None and live.state is not None
            return _incremental(config, spark, store, shaped, live, read, progress, started)
        return _full(config, spark, store, shaped, live, keys, read, progress, started)
    finally:
        shaped.unpersist()


def _check(
    shaped: DataFrame,
    client: SyncClient,
    config: JobConfig,
    *,
    distinct: bool,
    progress: Callable[[str], None],
) -> int:
    """Run the query once (cached), count it and refuse rows that break the gateway's rules."""
    from pyspark.sql import functions as F

    aggregates = [
        F.count(F.lit(1)).alias("read"),
        F.count(F.col("problem")).alias("bad"),
        F.first(
            F.concat(
                F.col("problem"),
                F.lit(" (listener "),
                F.coalesce(F.col("field"), F.lit("NULL")),
                F.lit(")"),
            ),
            ignorenulls=True,
        ).alias("example"),
        F.max(F.octet_length("value")).alias("longest"),
    ]
    if distinct:
        aggregates.append(F.count_distinct("field").alias("distinct"))
    row = shaped.agg(*aggregates).collect()[0]
    read = int(row["read"])
    progress(f"criteria query: {read:,} listeners")
    if row["bad"]:
        raise CriteriaJobError(
            f"{row['bad']:,} listener(s) break the gateway's rules for criteria, e.g. "
            f"{row['example']}; nothing was written"
        )
    if distinct and row["distinct"] != read:
        raise CriteriaJobError(
            f"{read - row['distinct']:,} listener id(s) appear in more than one row of the"
            f" criteria query, e.g. {', '.join(_duplicates(shaped))}: the query must return one"
            " row per listener (GROUP BY id); nothing was written"
        )
    _warn_listpack(client, config, row["longest"] or 0, progress)
    return read


def _duplicates(shaped: DataFrame) -> list[str]:
    rows = shaped.groupBy("field").count().where("count > 1").limit(3).collect()
    return [str(row["field"]) for row in rows]


def _full(
    config: JobConfig,
    spark: SparkSession,
    store: SnapshotStore,
    shaped: DataFrame,
    live: Live | None,
    keys: tuple[str, ...],
    read: int,
    progress: Callable[[str], None],
    started: float,
) -> Summary:
    from .frame import entries
    from .store import new_snapshot_id

    buckets = config.buckets or bucket_count(read, config.listeners_per_bucket)
    snapshot = new_snapshot_id()
    store.begin(snapshot, buckets)
    progress(f"writing snapshot {snapshot}: {read:,} listeners in {buckets:,} buckets")
    try:
        rows = entries(shaped, buckets)
        write_started = time.monotonic()
        stats = _write(spark, rows, config, store.layout.bucket_prefix(snapshot))
        write_seconds = time.monotonic() - write_started
        held = store.count(snapshot, buckets)
        if held != read:
            raise CriteriaJobError(
                f"{read - held:,} listener id(s) appear in more than one row of the criteria"
                f" query, e.g. {', '.join(_duplicates(shaped))}: the query must return one row"
                " per listener (GROUP BY id)"
            )
        progress(f"wrote {stats['listeners']:,} listeners in {write_seconds:.1f} s")
        state = _save_state(spark, shaped, config, snapshot) if config.state_dir else None
        store.go_live(Live(snapshot, buckets, state, keys), live, config.grace_seconds)
    except BaseException:
        _abandon(store, snapshot, buckets)
        raise
    if state is not None:
        assert config.state_dir is not None
        _sweep_states(spark, config.state_dir, keep=state)
    progress(
        f"snapshot {snapshot} is live; the previous one expires in {config.grace_seconds:g} s"
        if live
        else f"snapshot {snapshot} is live"
    )
    return Summary(
        "full",
        snapshot,
        buckets,
        read,
        stats["listeners"],
        0,
        time.monotonic() - started,
        write_seconds,
    )


def _abandon(store: SnapshotStore, snapshot: str, buckets: int) -> None:
    """Remove a snapshot that did not go live (if that fails too, the next run removes it)."""
    import redis as redis_py

    try:
        live = store.live()
        if live is None or live.snapshot != snapshot:
            store.discard(snapshot, buckets)
    except (redis_py.RedisError, ValueError):
        pass


def _incremental(
    config: JobConfig,
    spark: SparkSession,
    store: SnapshotStore,
    shaped: DataFrame,
    live: Live,
    read: int,
    progress: Callable[[str], None],
    started: float,
) -> Summary:
    from pyspark.sql import functions as F

    from .frame import changes as change_rows

    previous_state = live.state
    assert previous_state is not None
    if read > 3 * live.buckets * config.listeners_per_bucket:
        progress(
            f"note: {read:,} listeners in {live.buckets:,} buckets: run a full run to"
            " re-balance them"
        )
    new = shaped.select("field", "value", F.xxhash64("value").alias("digest"))
    old = spark.read.parquet(previous_state).select("field", F.col("digest").alias("previous"))
    diff = (
        new.join(old, "field", "full_outer")
        .where("value IS NULL OR previous IS NULL OR digest != previous")
        .select("field", "value")
    )
    # From here the live snapshot no longer matches the saved state: a run that dies before
    # the end leaves the pointer without state, so that the next run is a full one.
    store.update_live(Live(live.snapshot, live.buckets, None, live.keys))
    progress(f"writing the changes into the live snapshot {live.snapshot}")
    write_started = time.monotonic()
    stats = _write(
        spark,
        change_rows(diff, live.buckets),
        config,
        store.layout.bucket_prefix(live.snapshot),
        channel=store.layout.changes_channel,
    )
    write_seconds = time.monotonic() - write_started
    progress(f"{stats['listeners']:,} changed, {stats['removed']:,} removed and notified")
    state = _save_state(spark, new, config, live.snapshot)
    store.update_live(Live(live.snapshot, live.buckets, state, live.keys))
    assert config.state_dir is not None
    _sweep_states(spark, config.state_dir, keep=state)
    return Summary(
        "incremental",
        live.snapshot,
        live.buckets,
        read,
        stats["listeners"],
        stats["removed"],
        time.monotonic() - started,
        write_seconds,
    )


def _write(
    spark: SparkSession,
    rows: DataFrame,
    config: JobConfig,
    prefix: str,
    channel: str | None = None,
) -> dict[str, int]:
    """Run the writers in the executors; the totals of their stats rows."""
    from pyspark import cloudpickle
    from pyspark.sql import functions as F

    from .. import redis_client as redis_client_module
    from . import writer as writer_module
    from .writer import STATS, write_partition

    # Shipped by value: the executors need redis-py and pyarrow, not the gateway.
    for module in (writer_module, redis_client_module):
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(ARROW_BATCH))
    writer = partial(
        write_partition,
        redis=config.redis,
        client_defaults=CLIENT_DEFAULTS,
        prefix=prefix,
        channel=channel,
        notify_chunk=config.notify_chunk,
    )
    schema = ", ".join(f"{name} long" for name in STATS)
    totals = (
        rows.mapInArrow(writer, schema)
        .agg(*(F.sum(name).alias(name) for name in STATS))
        .collect()[0]
    )
    return {name: int(totals[name] or 0) for name in STATS}


def _save_state(spark: SparkSession, frame: DataFrame, config: JobConfig, snapshot: str) -> str:
    """Each listener's digest, for the next incremental run: a new Parquet folder."""
    from pyspark.sql import functions as F

    from .store import new_snapshot_id

    assert config.state_dir is not None
    path = f"{config.state_dir.rstrip('/')}/{snapshot}-{new_snapshot_id()[-4:]}"
    if "digest" not in frame.columns:
        frame = frame.select("field", F.xxhash64("value").alias("digest"))
    frame.select("field", "digest").write.mode("errorifexists").parquet(path)
    return path


def _hadoop_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm: Any = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    return hadoop_path.getFileSystem(conf), hadoop_path


def _exists(spark: SparkSession, path: str) -> bool:
    filesystem, hadoop_path = _hadoop_path(spark, path)
    return bool(filesystem.exists(hadoop_path))


_STATE_NAME: Final = re.compile(r"\d{8}T\d{6}Z[0-9a-f]{4}-[0-9a-f]{4}")
"""The folders :func:`_save_state` makes (anything else in ``state_dir`` is left alone)."""


def _sweep_states(spark: SparkSession, state_dir: str, keep: str) -> None:
    """Delete the state folders of earlier runs, also those a crashed run left, but ``keep``."""
    filesystem, folder = _hadoop_path(spark, state_dir)
    if not filesystem.exists(folder):
        return
    keep_name = keep.rstrip("/").rsplit("/", 1)[-1]
    for status in filesystem.listStatus(folder):
        path = status.getPath()
        name = str(path.getName())
        if name != keep_name and _STATE_NAME.fullmatch(name):
            filesystem.delete(path, True)


def _warn_listpack(
    client: SyncClient, config: JobConfig, longest: int, progress: Callable[[str], None]
) -> None:
    """Say when Redis would store buckets as hash tables (about 2x the memory of listpacks)."""
    limits: dict[str, int] = {}
    for name in ("entries", "value"):
        for spelling in (f"hash-max-listpack-{name}", f"hash-max-ziplist-{name}"):
            try:
                reply = client.config_get(spelling)
            except Exception:  # noqa: BLE001 - CONFIG may be disabled (managed Redis): no advice
                return
            if spelling in reply:
                limits[name] = int(str(reply[spelling]))
                break
    if "value" in limits and longest > limits["value"]:
        progress(
            f"warning: criteria up to {longest} bytes exceed the Redis setting"
            f" hash-max-listpack-value {limits['value']}: buckets holding them take more"
            " memory; raise it (see the README)"
        )
    if "entries" in limits and config.listeners_per_bucket * 1.5 > limits["entries"]:
        progress(
            f"warning: about {config.listeners_per_bucket} listeners per bucket (up to"
            f" ~{int(config.listeners_per_bucket * 1.5)}) exceed hash-max-listpack-entries"
            f" {limits['entries']}: raise it or lower snapshot.listeners_per_bucket"
        )


# -- command line --------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``criteria-job`` (shared by ``bow-gateway`` and ``python -m``)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get(CONFIG_ENV) or None,
        help=f"the job's TOML file (default: ${CONFIG_ENV})",
    )
    parser.add_argument(
        "--master",
        metavar="URL",
        help="the Spark master (default: the file's spark.master, else local[*])",
    )
    parser.add_argument(
        "--incremental",
        action="store_true",
        help="write only the listeners whose criteria changed since the last run",
    )


def run_command(
    args: argparse.Namespace, out: IO[str] | None = None, err: IO[str] | None = None
) -> int:
    """Run the job as the command line asked; the exit status (0 done, 1 failed, 2 bad config)."""
    out, err = out or sys.stdout, err or sys.stderr
    if not args.config:
        print(f"criteria-job: --config FILE is required (or ${CONFIG_ENV})", file=err)
        return 2
    try:
        config = load_job_config(args.config)
    except ConfigError as error:
        print(f"criteria-job: {args.config}: {error}", file=err)
        return 2
    progress = Progress(err)
    try:
        progress("starting Spark")
        spark = build_session(config, args.master)
        summary = run_job(config, spark, incremental=args.incremental, progress=progress)
    except CriteriaJobError as error:
        print(f"criteria-job: failed: {error}", file=err)
        return 1
    print(summary.text(), file=out)
    elapsed = time.monotonic() - progress.started
    print(f"  with Spark's start {elapsed:>12.1f} s", file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bow_gateway.criteria_job`` and ``spark-submit`` (of that file)."""
    parser = argparse.ArgumentParser(
        prog="criteria-job",
        description="Precompute every listener's criteria with Spark into Redis.",
    )
    add_arguments(parser)
    return run_command(parser.parse_args(argv))
