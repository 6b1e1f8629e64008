"""The criteria job's checks before it writes: the query's rows against the gateway's rules,
the sizes that set the Arrow batches, whether an incremental run may write into the live
snapshot. The rules are observed while the rows are cached (:func:`cached`); the duplicate ids
of an incremental run take a Spark job of their own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

    from ..core.criteria_snapshot import Live
    from .config import JobConfig


class CriteriaJobError(RuntimeError):
    """The job failed; the message says why (the live snapshot is untouched unless it says so)."""


ARROW_BATCH: Final = 65_536
"""Rows per Arrow batch to the writers (the default, 10,000, costs more round trips)."""
BATCH_BYTES: Final = "spark.sql.execution.arrow.maxBytesPerBatch"
BATCH_BYTES_DEFAULT: Final = 64 << 20
"""Spark's own limit of an Arrow batch in bytes (its default, 64 MiB)."""
FEWEST_ROWS: Final = 4096
"""Rows per Arrow batch below which Spark's own check of their bytes is kept."""
NO_BATCH_BYTES: Final = str(2**31 - 1)
"""Spark's "no limit" (Int.MaxValue): it then skips measuring the batch after every row."""


def same_columns(live: Live, keys: tuple[str, ...], kinds: list[DataType]) -> bool:
    """Whether an incremental run may write into the live snapshot: the same criteria keys, and
    no column with codes that can no longer hold strings (its numbers would read as codes)."""
    from .frame import codable

    if live.keys != keys:
        return False
    return live.codes is None or all(
        table is None or codable(kind) for table, kind in zip(live.codes, kinds, strict=True)
    )


def cached(frame: DataFrame, **measures: Column) -> tuple[DataFrame, dict[str, Any]]:
    """``frame`` cached, made by counting its rows (``rows``); ``measures``, aggregates over
    the rows, are observed while the cache is made, in the same pass."""
    from pyspark import StorageLevel
    from pyspark.sql import Observation

    observation = Observation()  # a name of its own: a session may run the job again
    observed = frame.observe(observation, *(c.alias(name) for name, c in measures.items()))
    frame = observed.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        rows = frame.count()
        measured = observation.get
    except BaseException:
        frame.unpersist()
        raise
    return frame, {**measured, "rows": rows}


def rules() -> dict[str, Column]:
    """The measures (see :func:`cached`) that :func:`refuse_broken` takes of the rows of
    :func:`bow_gateway.job.frame.prepare`: how many break the gateway's rules, why the first."""
    from pyspark.sql import functions as F

    return {
        "broken": F.count(F.col("problem")),
        "example": F.first(F.col("problem"), ignorenulls=True),
    }


def refuse_broken(measured: Mapping[str, Any]) -> None:
    """:class:`CriteriaJobError` if a listener breaks the gateway's rules (:func:`rules`)."""
    if measured["broken"]:
        raise CriteriaJobError(
            f"{measured['broken']:,} listener(s) break the gateway's rules for criteria, e.g. "
            f"{measured['example']}; nothing was written"
        )


def refuse_duplicates(prepared: DataFrame, read: int) -> None:
    """:class:`CriteriaJobError` if a listener id appears in more than one of the ``read``
    rows."""
    from pyspark.sql import functions as F

    distinct = int(prepared.agg(F.count_distinct("field")).collect()[0][0])
    if distinct != read:
        raise CriteriaJobError(
            f"{read - distinct:,} listener id(s) appear in more than one row of the criteria"
            f" query, e.g. {', '.join(duplicates(prepared))}: the query must return one row per"
            " listener (GROUP BY id); nothing was written"
        )


ENTRY_FRAMING: Final = 64
"""More than the bytes of a writer's row beyond its field and value (RESP headers, Arrow offsets
and validity, the other columns of a full run's rows)."""


def size_batches(spark: SparkSession, config: JobConfig, entry_bytes: int | None) -> None:
    """Arrow batches of up to :data:`ARROW_BATCH` rows to the writers. Spark's check of their
    size in bytes, which measures the whole batch after every row (a quarter of the JVM's time in
    the write phase), is turned off when the most bytes of a row are known (``entry_bytes``) and
    allows batches of :data:`FEWEST_ROWS` or more: batches then hold as many rows as keep them
    within Spark's limit."""
    rows = ARROW_BATCH
    if BATCH_BYTES in config.spark_conf:
        spark.conf.set(BATCH_BYTES, config.spark_conf[BATCH_BYTES])
    elif entry_bytes and entry_bytes * FEWEST_ROWS <= BATCH_BYTES_DEFAULT:
        rows = min(ARROW_BATCH, BATCH_BYTES_DEFAULT // entry_bytes)
        spark.conf.set(BATCH_BYTES, NO_BATCH_BYTES)
    else:
        spark.conf.unset(BATCH_BYTES)  # a session's earlier run may have turned it off
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(rows))


def duplicates(shaped: DataFrame) -> list[str]:
    rows = shaped.groupBy("field").count().where("count > 1").limit(3).collect()
    return [str(row["field"]) for row in rows]
