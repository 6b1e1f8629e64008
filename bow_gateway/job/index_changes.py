"""An incremental run's audience index: a new generation that copies the live one's bitmaps
(``DUMP`` and ``RESTORE``) and rewrites only those of the pairs its changed listeners held or hold.

The job keeps its own record of a generation's listeners (Parquet in ``snapshot.state_dir``:
``field``, ``digest``, ``number`` and the prepared criteria): a listener whose digest changed, or
that appeared or disappeared, takes its number out of its old pairs' bitmaps and puts it (an old
listener's number, or a new one after the others) into its new pairs'.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Final

from ..core.audience_layout import IndexLayout, IndexPointer
from .config import JobConfig
from .spark import hadoop_path
from .writing import CLIENT_DEFAULTS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ..runtime.redis_client import SyncClient

STATE_PREFIX: Final = "index-"
STATE_FOLDER: Final = "-index"
"""The index's states are kept beside ``snapshot.state_dir``, in ``{state_dir}-index``: that
folder is the criteria's own."""
COPY_BATCH: Final = 1000


def save_index_state(config: JobConfig, numbered: DataFrame, generation: str) -> str | None:
    """The generation's listeners (``field``, ``digest``, ``number``, criteria) as Parquet in
    ``{state_dir}-index``, for the next incremental run; ``None`` without a ``state_dir``."""
    folder = index_state_dir(config)
    if folder is None:
        return None
    path = f"{folder}/{STATE_PREFIX}{generation}"
    numbered.write.option("parquet.enable.dictionary", "false").mode("errorifexists").parquet(path)
    return path


def sweep_index_states(spark: SparkSession, config: JobConfig, keep: str | None) -> None:
    """Delete the index states of earlier generations (``index-...`` folders) but ``keep``."""
    where = index_state_dir(config)
    if where is None:
        return
    filesystem, folder = hadoop_path(spark, where)
    if not filesystem.exists(folder):
        return
    keep_name = (keep or "").rstrip("/").rsplit("/", 1)[-1]
    for status in filesystem.listStatus(folder):
        name = str(status.getPath().getName())
        if name.startswith(STATE_PREFIX) and name != keep_name:
            filesystem.delete(status.getPath(), True)


def index_state_dir(config: JobConfig) -> str | None:
    """Where the index's states are kept (:data:`STATE_FOLDER`)."""
    return None if config.state_dir is None else config.state_dir.rstrip("/") + STATE_FOLDER


def usable_state(spark: SparkSession, previous: IndexPointer | None, names: list[str]) -> bool:
    """Whether the live generation's state exists and holds these criteria columns."""
    from .spark import exists

    if previous is None or previous.state is None or not exists(spark, previous.state):
        return False
    columns = spark.read.parquet(previous.state).columns
    return columns == ["field", "digest", "number", *names]


def copy_generation(
    client: SyncClient, layout: IndexLayout, previous: str, generation: str
) -> None:
    """Every bitmap of ``previous`` and its ``pairs`` hash, copied to ``generation`` with
    ``DUMP`` and ``RESTORE`` (``COPY`` needs both keys in one slot of a Redis Cluster), a
    batch of :data:`COPY_BATCH` keys a round trip each way."""
    pairs = layout.pairs_key(previous)
    batch = [(pairs, layout.pairs_key(generation))]
    for pair, _ in client.hscan_iter(pairs, count=1000):
        name = pair.decode() if isinstance(pair, bytes) else pair
        batch.append((layout.bitmap_key(previous, name), layout.bitmap_key(generation, name)))
        if len(batch) >= COPY_BATCH:
            _copied(client, batch)
            batch = []
    _copied(client, batch)


def _copied(client: SyncClient, batch: list[tuple[str, str]]) -> None:
    """Each ``(source, target)`` of ``batch``: ``target`` a copy of ``source``."""
    if not batch:
        return
    dumping = client.pipeline(transaction=False)
    for source, _ in batch:
        dumping.dump(source)
    restoring = client.pipeline(transaction=False)
    for (_, target), payload in zip(batch, dumping.execute(), strict=True):
        if payload is not None:
            restoring.restore(target, 0, payload, replace=True)
    restoring.execute()


def changed_pairs(
    config: JobConfig,
    spark: SparkSession,
    numbered: DataFrame,
    old: DataFrame,
    keys: list[str],
    previous: str,
    generation: str,
) -> None:
    """Rewrite, in ``generation``, the bitmaps of the pairs whose listeners changed between
    ``old`` (the live generation's state) and ``numbered`` (this run's listeners)."""
    from pyspark.sql import functions as F

    from .index_parts import (
        CHANGES_SCHEMA,
        PARTS_SCHEMA,
        STATS_SCHEMA,
        apply_changes,
        partial_bitmaps,
    )

    names = [f"bow_c{index}" for index in range(len(keys))]
    before = old.select("field", F.col("digest").alias("before"))
    moved = (
        numbered.select("field", "digest")
        .join(before, "field", "full_outer")
        .where("digest IS NULL OR before IS NULL OR digest != before")
        .select("field")
    )
    builder = partial(partial_bitmaps, keys=keys)
    parts = PARTS_SCHEMA
    gone = old.join(moved, "field", "left_semi").select("number", *names)
    came = numbered.join(moved, "field", "left_semi").select("number", *names)
    rows = (
        gone.mapInArrow(builder, parts)
        .withColumn("removed", F.lit(True))
        .unionByName(came.mapInArrow(builder, parts).withColumn("removed", F.lit(False)))
        .select(*(column.split()[0] for column in CHANGES_SCHEMA.split(", ")))
    )
    layout = IndexLayout(config.namespace)
    writer = partial(
        apply_changes,
        redis=config.redis,
        client_defaults=CLIENT_DEFAULTS,
        previous=layout.prefix(previous),
        prefix=layout.prefix(generation),
        pairs_key=layout.pairs_key(generation),
    )
    sums(rows.repartition(partitions(spark), "pair").mapInArrow(writer, STATS_SCHEMA))


def totals(client: SyncClient, layout: IndexLayout, generation: str) -> tuple[int, int]:
    """The distinct pairs of a generation and its listener-criterion pairs (from ``pairs``)."""
    pairs = members = 0
    for _, count in client.hscan_iter(layout.pairs_key(generation), count=1000):
        pairs += 1
        members += int(count)
    return pairs, members


def partitions(spark: SparkSession) -> int:
    """How many partitions the index's shuffles make: Spark SQL's setting."""
    return int(spark.conf.get("spark.sql.shuffle.partitions") or 2)


def sums(frame: DataFrame) -> dict[str, int]:
    """Run a writer's frame; the sums of its stats rows."""
    from pyspark.sql import functions as F

    row = frame.agg(*(F.sum(name).alias(name) for name in frame.columns)).collect()[0]
    return {name: int(row[name] or 0) for name in frame.columns}
