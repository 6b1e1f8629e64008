"""``bow-gateway criteria-job``: precompute every listener's criteria with Spark, swap them in live.

The inputs of the job file become Spark SQL views; one query returns a row per listener (an ``id``
column and one column per criterion); the executors write the rows to Redis in the layout of
:mod:`bow_gateway.core.criteria_snapshot`, pipelined, as a new snapshot that goes live with one
``SET`` and a notification. ``--incremental`` diffs each listener's criteria against the previous
run's digests (Parquet, in ``snapshot.state_dir``) and writes only what changed into the live
snapshot.

Its command line is :mod:`.command`; the Spark session and filesystem are :mod:`.spark`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..core.criteria_snapshot import Codes, Layout, Live, bucket_count
from ..runtime.redis_client import describe, sync_redis_client
from .checks import (
    ENTRY_FRAMING,
    cached,
    duplicates,
    refuse_broken,
    refuse_duplicates,
    rules,
    same_columns,
    size_batches,
)
from .checks import CriteriaJobError as CriteriaJobError
from .config import Input, JobConfig
from .index import audience_index
from .spark import exists, short, spark_failure, sweep_states
from .writing import CLIENT_DEFAULTS, abandon, save_state, warn_listpack, write_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from .store import SnapshotStore


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


def register_inputs(spark: SparkSession, config: JobConfig) -> None:
    """Every ``[[inputs]]`` table as a temporary Spark SQL view.

    They are opened at once, each in a thread of its own: opening one may take a Spark job
    (Parquet's schema, from its files' footers) that leaves most cores idle."""
    from concurrent.futures import ThreadPoolExecutor

    if not config.inputs:
        return
    with ThreadPoolExecutor(len(config.inputs), thread_name_prefix="bow-input") as pool:
        frames = list(pool.map(lambda source: _open(spark, source), config.inputs))
    for source, frame in zip(config.inputs, frames, strict=True):
        frame.createOrReplaceTempView(source.name)


def _open(spark: SparkSession, source: Input) -> DataFrame:
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    reader = spark.read.format(source.format).options(**source.options)
    if source.schema is not None:
        reader = reader.schema(source.schema)
    try:
        return reader.load(list(source.paths)) if source.paths else reader.load()
    except (PySparkException, Py4JError) as error:
        raise CriteriaJobError(f"input {source.name!r}: cannot read it: {short(error)}") from None


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
                config, spark, store, incremental, progress or (lambda _: None), started
            )
    except (LockHeld, LockLost, CriteriaQueryError) as error:
        raise CriteriaJobError(str(error)) from None
    except (redis_py.RedisError, redis_py.exceptions.RedisClusterException) as error:
        raise CriteriaJobError(f"Redis at {describe(config.redis)}: {error}") from None
    except (PySparkException, Py4JError) as error:
        raise CriteriaJobError(f"Spark failed: {spark_failure(error, spark)}") from None
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
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    from .frame import check_schema, code_tables, digest_of, prepare, shape

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
    columns = check_schema(frame)
    keys = tuple(name for name, _ in columns)
    kinds = [kind for _, kind in columns]
    prepared, measured = cached(prepare(frame), **rules(), field=F.max(F.octet_length("field")))
    try:
        read = measured["rows"]
        progress(f"criteria query: {read:,} listeners")
        refuse_broken(measured)
        if incremental:
            refuse_duplicates(prepared, read)
        if incremental and (live is None or live.state is None or not exists(spark, live.state)):
            progress("no state of a previous run to compare with: a full run instead")
            incremental = False
        elif incremental and live is not None and not same_columns(live, keys, kinds):
            progress("the query's criteria columns changed since the live snapshot: a full run")
            incremental = False
        if incremental:
            assert live is not None
            codes = live.codes  # the live snapshot's: a string without a code stays a string
        else:
            codes = code_tables(prepared, kinds, read)
            if codes is not None:
                coded = [f"{k} {len(t)}" for k, t in zip(keys, codes, strict=True) if t]
                progress(f"codes for the frequent strings of {', '.join(coded)}")
        with audience_index(config, spark, store, prepared, columns, incremental, progress):
            shaped = shape(prepared, kinds, codes, digest=incremental)
            if incremental:
                assert live is not None and live.state is not None
                # its rows are made as the writers take them, their sizes unknown beforehand
                size_batches(spark, config, None)
                return _incremental(config, spark, store, shaped, live, read, progress, started)
            digests = prepared.select("field", digest_of(kinds).alias("digest"))
            longest_id = measured["field"] or 0
            return _full(
                config,
                spark,
                store,
                shaped,
                digests,
                live,
                keys,
                codes,
                read,
                longest_id,
                progress,
                started,
            )
    finally:
        prepared.unpersist()


def _full(
    config: JobConfig,
    spark: SparkSession,
    store: SnapshotStore,
    shaped: DataFrame,
    digests: DataFrame,
    live: Live | None,
    keys: tuple[str, ...],
    codes: Codes | None,
    read: int,
    longest_id: int,
    progress: Callable[[str], None],
    started: float,
) -> Summary:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from .frame import entries

    buckets = config.buckets or bucket_count(read, config.listeners_per_bucket)
    # The commands are made (and cached) before the writers start: while Redis is written to,
    # the JVM only hands them over.
    rows = entries(shaped, buckets).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # an aggregate over the cache (observing it while the cache is made cost more)
        longest = int(rows.agg(F.max("size")).collect()[0][0] or 0)
        size_batches(spark, config, longest + longest_id + ENTRY_FRAMING)
        progress(f"commands made: values of up to {longest:,} bytes")
        warn_listpack(store, {"longest": longest}, config, progress)
        return _write_full(
            config,
            spark,
            store,
            rows,
            shaped,
            digests,
            live,
            keys,
            codes,
            buckets,
            read,
            progress,
            started,
        )
    finally:
        rows.unpersist()


def _write_full(
    config: JobConfig,
    spark: SparkSession,
    store: SnapshotStore,
    rows: DataFrame,
    shaped: DataFrame,
    digests: DataFrame,
    live: Live | None,
    keys: tuple[str, ...],
    codes: Codes | None,
    buckets: int,
    read: int,
    progress: Callable[[str], None],
    started: float,
) -> Summary:
    from .store import new_snapshot_id

    snapshot = new_snapshot_id()
    store.begin(snapshot, buckets)
    progress(f"writing snapshot {snapshot}: {read:,} listeners in {buckets:,} buckets")
    try:
        write_started = time.monotonic()
        stats = write_rows(spark, rows, config, store.layout.bucket_prefix(snapshot))
        write_seconds = time.monotonic() - write_started
        held = store.count(snapshot, buckets)
        if held != read:
            raise CriteriaJobError(
                f"{read - held:,} listener id(s) appear in more than one row of the criteria"
                f" query, e.g. {', '.join(duplicates(shaped))}: the query must return one row"
                " per listener (GROUP BY id)"
            )
        progress(f"wrote {stats['listeners']:,} listeners in {write_seconds:.1f} s")
        state = save_state(spark, digests, config, snapshot) if config.state_dir else None
        store.go_live(
            Live(snapshot, buckets, state, keys, codes),
            live,
            config.grace_seconds,
        )
    except BaseException:
        abandon(store, snapshot, buckets)
        raise
    if state is not None:
        assert config.state_dir is not None
        sweep_states(spark, config.state_dir, keep=state)
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
    new = shaped
    old = spark.read.parquet(previous_state).select("field", F.col("digest").alias("previous"))
    diff = (
        new.join(old, "field", "full_outer")
        .where("value IS NULL OR previous IS NULL OR digest != previous")
        .select("field", "value")
    )
    # From here the live snapshot no longer matches the saved state: a run that dies before
    # the end leaves the pointer without state, so that the next run is a full one.
    store.update_live(replace(live, state=None))
    progress(f"writing the changes into the live snapshot {live.snapshot}")
    write_started = time.monotonic()
    stats = write_rows(
        spark,
        change_rows(diff, live.buckets),
        config,
        store.layout.bucket_prefix(live.snapshot),
        channel=store.layout.changes_channel,
    )
    write_seconds = time.monotonic() - write_started
    progress(f"{stats['listeners']:,} changed, {stats['removed']:,} removed and notified")
    warn_listpack(store, stats, config, progress)
    state = save_state(spark, new, config, live.snapshot)
    store.update_live(replace(live, state=state), index=True)
    assert config.state_dir is not None
    sweep_states(spark, config.state_dir, keep=state)
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
