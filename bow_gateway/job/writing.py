"""The criteria job's steps around the writers: running them (Spark's ``mapInArrow`` and their
stats), the Redis settings' warnings, the state an incremental run compares with, the removal of
a snapshot that did not go live. Used by :mod:`.run`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Final

from .config import JobConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from .store import SnapshotStore

CLIENT_DEFAULTS: Final = {"socket_timeout": 60, "socket_connect_timeout": 10}
"""redis-py settings of the job's clients (the driver's and the writers'), unless the file's."""


def abandon(store: SnapshotStore, snapshot: str, buckets: int) -> None:
    """Remove a snapshot that did not go live (if that fails too, the next run removes it)."""
    import redis as redis_py

    try:
        live = store.live()
        if live is None or live.snapshot != snapshot:
            store.discard(snapshot, buckets)
    except (redis_py.RedisError, ValueError):
        pass


def write_rows(
    spark: SparkSession,
    rows: DataFrame,
    config: JobConfig,
    prefix: str,
    channel: str | None = None,
) -> dict[str, int]:
    """Run the writers in the executors; the totals of their stats rows."""
    from pyspark import cloudpickle
    from pyspark.sql import functions as F

    from ..runtime import redis_client as redis_client_module
    from . import writer as writer_module
    from .writer import STATS, write_partition

    # Shipped by value: the executors need redis-py and pyarrow, not the gateway.
    for module in (writer_module, redis_client_module):
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
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
        .agg(*((F.max if name == "longest" else F.sum)(name).alias(name) for name in STATS))
        .collect()[0]
    )
    return {name: int(totals[name] or 0) for name in STATS}


def warn_listpack(
    store: SnapshotStore, stats: dict[str, int], config: JobConfig, progress: Callable[[str], None]
) -> None:
    """What to say about the Redis settings, knowing the longest value (``stats["longest"]``)."""
    from .store import listpack_warnings

    for warning in listpack_warnings(store.client, stats["longest"], config.listeners_per_bucket):
        progress(warning)


def save_state(spark: SparkSession, frame: DataFrame, config: JobConfig, snapshot: str) -> str:
    """Each listener's digest (``field``, ``digest``), for the next incremental run: a new
    Parquet folder."""

    from .store import new_snapshot_id

    assert config.state_dir is not None
    path = f"{config.state_dir.rstrip('/')}/{snapshot}-{new_snapshot_id()[-4:]}"
    # One id and one digest per listener: a dictionary would hold every value, so Parquet's
    # attempt at one (before it falls back to plain) is wasted: ~13% of the write.
    writer = frame.select("field", "digest").write.option("parquet.enable.dictionary", "false")
    writer.mode("errorifexists").parquet(path)
    return path
