"""The criteria job's checks before it writes: the query's rows against the gateway's rules,
the sizes that set the Arrow batches, whether an incremental run may write into the live
snapshot. They run on the driver (Spark jobs over the cached query result)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

    from ..criteria_snapshot import Live
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


def check(
    prepared: DataFrame,
    bound: Column,
    *,
    distinct: bool,
    progress: Callable[[str], None],
) -> tuple[int, int, int]:
    """Run the query once (cached), count it and refuse rows that break the gateway's rules;
    the listeners read, the bytes of the longest field, the largest ``bound`` (of a value)."""
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
        F.max(F.octet_length("field")).alias("longest_field"),
        F.max(bound).alias("bound"),
    ]
    if distinct:
        aggregates.append(F.count_distinct("field").alias("distinct"))
    row = prepared.agg(*aggregates).collect()[0]
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
            f" criteria query, e.g. {', '.join(duplicates(prepared))}: the query must return one"
            " row per listener (GROUP BY id); nothing was written"
        )
    return read, int(row["longest_field"] or 0), int(row["bound"] or 0)


ENTRY_FRAMING: Final = 64
"""More than the bytes of a writer's row beyond its field and value, and its field again in the
``notify`` column (RESP headers, Arrow offsets and validity, the other columns)."""


def size_batches(spark: SparkSession, config: JobConfig, entry_bytes: int | None) -> None:
    """Arrow batches of up to :data:`ARROW_BATCH` rows to the writers. Spark's check of their
    size in bytes, which measures the whole batch after every row (a quarter of the JVM's time in
    the write phase), is turned off when a bound on a row's bytes is known (``entry_bytes``) and
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
