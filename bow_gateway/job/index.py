"""The criteria job's audience index: a dense numbering of the listeners and, for every criterion
(key, value) any of them holds, a compressed bitmap of their numbers, written as a new generation
that goes live with the criteria (layout: :mod:`bow_gateway.core.audience_layout`).

Each partition builds partial bitmaps (:func:`.index_parts.partial_bitmaps`), a shuffle by pair
brings a pair's partials together, their union is written from the executors. A full run numbers
the listeners 0..n-1; an incremental run keeps the numbers of the live generation (read back from
its ``ids`` chunks), gives new listeners numbers after them, and leaves removed ones' as holes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Final

from ..core.audience_layout import CHUNK, IndexLayout, IndexPointer
from .config import JobConfig
from .index_changes import partitions, sums
from .writing import CLIENT_DEFAULTS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

    from ..runtime.redis_client import SyncClient
    from .store import SnapshotStore

_MASK: Final = (1 << 33) - 1
"""``monotonically_increasing_id`` is the partition's index << 33 plus the row's in it."""


@contextmanager
def audience_index(
    config: JobConfig,
    spark: SparkSession,
    store: SnapshotStore,
    prepared: DataFrame,
    columns: list[tuple[str, DataType]],
    incremental: bool,
    progress: Callable[[str], None],
) -> Iterator[None]:
    """Write a new generation for :func:`.frame.prepare`'s rows before the body runs; the body's
    switch (``store.index_pointer``) makes it live, or it is removed if the body fails."""
    from .index_changes import sweep_index_states
    from .index_store import IndexStore
    from .store import new_snapshot_id

    index = IndexStore(store.client, IndexLayout(config.namespace))
    removed = index.clean_up()
    if removed:
        progress(f"removed audience index generation(s) earlier runs left: {', '.join(removed)}")
    previous = index.live()
    if not config.index_enabled:
        store.index_pointer = None if previous is None else ""  # "": the pointer is deleted
        yield
        index.went_live(None, previous, config.grace_seconds)
        sweep_index_states(spark, config, None)
        return
    generation = new_snapshot_id()
    index.begin(generation)
    try:
        pointer = build_index(
            config,
            spark,
            store.client,
            prepared,
            columns,
            generation,
            previous if incremental else None,
            progress,
        )
        progress(
            f"audience index {generation}: {pointer.members:,} listener-criterion pairs,"
            f" {pointer.pairs:,} bitmaps"
        )
        store.index_pointer = pointer.to_json()
        yield
    except BaseException:
        index.abandon(generation)
        raise
    index.went_live(pointer, previous, config.grace_seconds)
    sweep_index_states(spark, config, pointer.state)


def typed(kinds: list[DataType]) -> list[Column]:
    """The prepared criteria columns with their values typed again (booleans, whole numbers,
    doubles, strings, lists of those), not as the JSON that :func:`.frame.prepare` made."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        ByteType,
        DoubleType,
        IntegerType,
        LongType,
        ShortType,
    )

    from .frame import codable

    columns = []
    for index, kind in enumerate(kinds):
        name = f"bow_c{index}"
        column = F.col(name)
        if not codable(kind):
            item = kind.elementType if isinstance(kind, ArrayType) else kind
            if isinstance(item, BooleanType):
                target: DataType = BooleanType()
            elif isinstance(item, (ByteType, ShortType, IntegerType, LongType)):
                target = LongType()
            else:
                target = DoubleType()
            if isinstance(kind, ArrayType):
                column = F.from_json(column, ArrayType(target))
            else:
                column = F.when(column != F.lit("null"), column).cast(target)
        columns.append(column.alias(name))
    return columns


def build_index(
    config: JobConfig,
    spark: SparkSession,
    client: SyncClient,
    prepared: DataFrame,
    columns: list[tuple[str, DataType]],
    generation: str,
    previous: IndexPointer | None,
    progress: Callable[[str], None] = lambda _: None,
) -> IndexPointer:
    """Number the listeners, write the generation's bitmaps (all of them, or with ``previous``
    and its state, only the changed ones) and ``ids`` chunks, save its state; its pointer."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from .frame import digest_of
    from .index_changes import (
        changed_pairs,
        copy_generation,
        save_index_state,
        totals,
        usable_state,
    )

    _ship()
    layout = IndexLayout(config.namespace)
    keys, kinds = [name for name, _ in columns], [kind for _, kind in columns]
    names = [f"bow_c{index}" for index in range(len(kinds))]
    base = prepared.select("field", digest_of(kinds).alias("digest"), *typed(kinds))
    state = (
        previous.state if previous is not None and usable_state(spark, previous, names) else None
    )
    old = None if state is None else spark.read.parquet(state)
    held: list[DataFrame] = []
    numbered, first_free = _numbered(spark, config, base, previous, old, held)
    numbered = numbered.select("field", "digest", "number", *names)
    numbered = numbered.persist(StorageLevel.MEMORY_AND_DISK)
    held.append(numbered)
    try:
        listeners = numbered.count()
        top = numbered.agg(F.max("number")).collect()[0][0]
        next_number = max(first_free, -1 if top is None else int(top) + 1)
        progress(f"audience index: {listeners:,} listeners numbered")
        if old is not None and previous is not None:
            copy_generation(client, layout, previous.generation, generation)
            changed_pairs(
                config,
                spark,
                numbered,
                old,
                keys,
                previous.generation,
                generation,
            )
        else:
            _all_pairs(config, spark, numbered, keys, generation)
        progress("audience index: bitmaps written")
        _write_chunks(spark, config, numbered, layout.prefix(generation))
        progress("audience index: ids written")
        saved = save_index_state(config, numbered, generation)
    finally:
        for frame in held:
            frame.unpersist()
    pairs, members = totals(client, layout, generation)
    return IndexPointer(generation, listeners, next_number, pairs, members, saved)


def _all_pairs(
    config: JobConfig,
    spark: SparkSession,
    numbered: DataFrame,
    keys: list[str],
    generation: str,
) -> None:
    """Every pair's bitmap: partial ones per partition, their unions written by pair."""
    from .index_parts import PARTS_SCHEMA, STATS_SCHEMA, merge_and_write, partial_bitmaps

    layout = IndexLayout(config.namespace)
    names = [f"bow_c{index}" for index in range(len(keys))]
    parts = numbered.select("number", *names).mapInArrow(
        partial(partial_bitmaps, keys=keys), PARTS_SCHEMA
    )
    writer = partial(
        merge_and_write,
        redis=config.redis,
        client_defaults=CLIENT_DEFAULTS,
        prefix=layout.prefix(generation),
        pairs_key=layout.pairs_key(generation),
    )
    sums(parts.repartition(partitions(spark), "pair").mapInArrow(writer, STATS_SCHEMA))


def _ship() -> None:
    """The executors' modules by value: they need redis-py, pyarrow and pyroaring only."""
    from pyspark import cloudpickle

    from ..core import audience_layout
    from ..runtime import redis_client
    from . import index_parts

    for module in (index_parts, audience_layout, redis_client):
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]


def _numbered(
    spark: SparkSession,
    config: JobConfig,
    base: DataFrame,
    previous: IndexPointer | None,
    state: DataFrame | None,
    held: list[DataFrame],
) -> tuple[DataFrame, int]:
    """``base`` with ``number``; the first number free for listeners to come (``held``: what
    was cached on the way, to unpersist): the numbers of ``previous``, from its ``state`` or else
    its ``ids`` chunks, new ones after them."""
    from pyspark.sql import functions as F

    if previous is None:
        return _dense(base, 0, held, stable=True), 0
    if state is not None:
        old = state.select("field", "number")
    else:
        from .index_parts import read_chunks

        reader = partial(
            read_chunks,
            redis=config.redis,
            prefix=IndexLayout(config.namespace).prefix(previous.generation),
            chunk=CHUNK,
            client_defaults=CLIENT_DEFAULTS,
        )
        chunks = spark.range(previous.chunks, numPartitions=max(1, min(partitions(spark), 64)))
        old = chunks.mapInArrow(reader, "field string, number long")
    joined = base.join(old, "field", "left")
    known = joined.where(F.col("number").isNotNull())
    fresh = _dense(joined.where(F.col("number").isNull()).drop("number"), previous.next, held)
    return known.unionByName(fresh), previous.next


def _dense(
    frame: DataFrame, start: int, held: list[DataFrame], *, stable: bool = False
) -> DataFrame:
    """``frame`` with ``number``: ``start``, ``start + 1``... one per row, partitions in order.
    The rows are cached (the ids must be the same when counted and when used) unless
    ``stable``: a projection of a cached frame, whose partitions and rows keep their order."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    marked = frame.withColumn("bow_mid", F.monotonically_increasing_id())
    if not stable:
        marked = marked.persist(StorageLevel.MEMORY_AND_DISK)
        held.append(marked)
    counts = (
        marked.groupBy(F.shiftright("bow_mid", 33).alias("p"))
        .agg(F.max(F.col("bow_mid").bitwiseAND(F.lit(_MASK))).alias("top"))
        .collect()
    )
    offsets: dict[int, int] = {}
    total = start
    for row in sorted(counts, key=lambda r: int(r["p"])):
        offsets[int(row["p"])] = total
        total += int(row["top"]) + 1
    partition = F.shiftright("bow_mid", 33)
    offset: Column = F.lit(start).cast("long")
    if offsets:
        mapping = F.create_map(*(F.lit(x) for pair in offsets.items() for x in pair))
        offset = F.element_at(mapping, partition).cast("long")
    number = offset + F.col("bow_mid").bitwiseAND(F.lit(_MASK))
    return marked.withColumn("number", number).drop("bow_mid")


def _write_chunks(spark: SparkSession, config: JobConfig, numbered: DataFrame, prefix: str) -> None:
    """The number -> id chunks, each written by one task."""
    from pyspark.sql import functions as F

    from .index_parts import STATS_SCHEMA, write_chunks

    writer = partial(
        write_chunks,
        redis=config.redis,
        prefix=prefix,
        chunk=CHUNK,
        client_defaults=CLIENT_DEFAULTS,
    )
    rows = numbered.select("number", "field").repartition(
        partitions(spark), F.floor(F.col("number") / CHUNK)
    )
    sums(rows.mapInArrow(writer, STATS_SCHEMA))
