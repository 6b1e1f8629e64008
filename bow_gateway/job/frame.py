"""From the criteria query's rows to Redis commands, all in Spark SQL (nothing per row in Python).

:func:`prepare` checks the query's column types against the gateway's rules before anything
runs, and turns each row into ``field`` (the listener id as JSON), ``problem`` (why the row breaks
the gateway's rules, or NULL) and its criteria cleaned (lists de-duplicated and sorted so that
equal criteria are equal bytes); :func:`code_tables` chooses the codes of frequent strings;
:func:`shape` makes ``value`` (the criteria as a compact JSON array, by position, strings coded);
:func:`entries` and :func:`changes` build the RESP bytes of ``HSET``/``HDEL`` arguments with
``concat``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
)

from ..core.criteria import ID_KEY
from ..core.criteria_snapshot import Codes

ID_COLUMN: Final = "id"
_INTEGRAL: Final = (ByteType, ShortType, IntegerType, LongType)
_SCALARS: Final = (BooleanType, *_INTEGRAL, FloatType, DoubleType, DecimalType, StringType)
_CRLF: Final = "\r\n"


class CriteriaQueryError(ValueError):
    """The criteria query's result cannot be criteria: the message names the column."""


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _col(name: str) -> Column:
    return F.col(_quoted(name))


def check_schema(frame: DataFrame) -> list[tuple[str, DataType]]:
    """The criteria columns and their types; :class:`CriteriaQueryError` for anything else."""
    names = [f.name for f in frame.schema.fields]
    for name in names:
        if names.count(name) > 1:
            raise CriteriaQueryError(f"column {name!r} appears twice in the criteria query")
    if ID_COLUMN not in names:
        raise CriteriaQueryError(
            f"the criteria query must return an {ID_COLUMN!r} column (it returns: "
            f"{', '.join(names) or 'nothing'})"
        )
    columns = []
    for field in frame.schema.fields:
        kind = field.dataType
        if field.name == ID_COLUMN:
            if not isinstance(kind, (*_INTEGRAL, StringType)):
                raise CriteriaQueryError(
                    f"column 'id' has type {kind.simpleString()}: a listener id must be a whole"
                    " number (tinyint to bigint) or a string; CAST it"
                )
            continue
        if field.name == ID_KEY:
            raise CriteriaQueryError(f"column {ID_KEY!r}: the gateway sets it to the listener id")
        item = kind.elementType if isinstance(kind, ArrayType) else kind
        if not isinstance(item, _SCALARS):
            raise CriteriaQueryError(
                f"column {field.name!r} has type {kind.simpleString()}: criteria are booleans,"
                " numbers, strings or arrays of those; CAST it or leave it out"
            )
        columns.append((field.name, kind))
    return columns


def _is_bad(kind: DataType) -> Callable[[Column], Column] | None:
    """A condition, true when a (non-NULL) scalar of this type breaks the gateway's rules."""
    if isinstance(kind, StringType):
        return lambda value: value == F.lit("")
    if isinstance(kind, (FloatType, DoubleType)):
        return lambda value: F.isnan(value) | (F.abs(value) == F.lit(float("inf")))
    return None


def _what(kind: DataType) -> str:
    return "an empty string" if isinstance(kind, StringType) else "NaN or an infinity"


def criteria_keys(frame: DataFrame) -> tuple[str, ...]:
    """The criteria keys of the query's result, in the order :func:`shape` writes their values."""
    return tuple(name for name, _ in check_schema(frame))


def _criterion(index: int) -> str:
    return f"bow_c{index}"


def prepare(frame: DataFrame) -> DataFrame:
    """``field`` (the listener id as JSON), ``problem`` (why the row breaks the gateway's rules,
    naming the listener, or NULL) and each criterion by position: a column of strings cleaned
    (lists without NULLs and duplicates, sorted, NULL when empty), what :func:`code_tables`
    counts and :func:`shape` encodes; any other column already as its JSON (``null`` for a
    NULL)."""
    columns = check_schema(frame)
    raw_id = _col(ID_COLUMN)
    id_type = frame.schema[ID_COLUMN].dataType
    if isinstance(id_type, StringType):
        id_json = F.to_json(F.array(raw_id))  # ["..."]: JSON-escaped, quotes included
        field = F.expr("substr(bow_id_json, 2, length(bow_id_json) - 2)")
        id_problem = F.when(raw_id.isNull(), "id is NULL").when(raw_id == "", "id is empty")
    else:
        id_json = raw_id.cast("string")
        field = F.col("bow_id_json")
        id_problem = F.when(raw_id.isNull(), "id is NULL")
    problems: list[Column] = [id_problem]
    cleaned: list[Column] = []
    for index, (name, kind) in enumerate(columns):
        value = _col(name)
        if isinstance(kind, ArrayType):
            item = kind.elementType
            is_bad = _is_bad(item)
            if is_bad is not None:
                # array_contains is compiled with the query; a lambda (exists) is interpreted
                bad = (
                    F.array_contains(value, F.lit(""))
                    if isinstance(item, StringType)
                    else F.exists(value, is_bad)
                )
                problems.append(F.when(bad, f"column {name!r} holds {_what(item)}"))
            # Without NULLs and duplicates (array_except with [NULL]: one hash set), sorted. No
            # lambda (filter, array_sort: interpreted row by row) and no array_compact (a
            # filter underneath): they keep the whole projection out of generated code.
            tidy = F.sort_array(F.array_except(value, F.array(F.lit(None).cast(item))))
            # An empty list matches nothing. nullif makes the list once: in when(size(tidy) > 0,
            # tidy) the branch's tidy is not a common subexpression, and was made twice.
            value = F.nullif(tidy, F.array().cast(kind))
            if not codable(kind):
                value = F.coalesce(F.to_json(value), F.lit("null"))
        else:
            is_bad = _is_bad(kind)
            if is_bad is not None:
                problems.append(F.when(is_bad(value), f"column {name!r} is {_what(kind)}"))
            if isinstance(kind, (BooleanType, *_INTEGRAL)):
                value = F.coalesce(value.cast("string"), F.lit("null"))  # its JSON already
            elif not codable(kind):
                value = _scalar_json(value)
        cleaned.append(value.alias(_criterion(index)))
    names = [_criterion(index) for index in range(len(columns))]
    return frame.select(
        id_json.alias("bow_id_json"),
        (F.coalesce(*problems) if len(problems) > 1 else problems[0]).alias("problem"),
        *cleaned,
    ).select(
        field.alias("field"),
        F.concat(
            "problem", F.lit(" (listener "), F.coalesce(field, F.lit("NULL")), F.lit(")")
        ).alias("problem"),
        *names,
    )


def codable(kind: DataType) -> bool:
    """Whether a column's strings may be stored as codes: strings, lists of strings."""
    item = kind.elementType if isinstance(kind, ArrayType) else kind
    return isinstance(item, StringType)


CODE_SAMPLE: Final = 100_000
"""About this many listeners (chosen by a hash of their id) are counted to choose the codes."""
MAX_CODES: Final = 100
"""Codes per column at most (0 to 99: one or two bytes for a string of at least three)."""
CODE_SHARE: Final = 1000
"""A string gets a code when at least one listener in this many holds it (and two do)."""


def code_tables(prepared: DataFrame, kinds: list[DataType], listeners: int) -> Codes | None:
    """The codes of each string column: its most frequent strings, the most frequent first, in
    a sample of the listeners chosen by a hash of their id (so the same data gives the same
    codes however it is partitioned); ``None`` when no column has any."""
    positions = [index for index, kind in enumerate(kinds) if codable(kind)]
    if not positions:
        return None
    sample = prepared
    if listeners > CODE_SAMPLE:
        sample = sample.where(F.pmod(F.xxhash64("field"), F.lit(listeners)) < F.lit(CODE_SAMPLE))
    pairs: list[Column] = []
    for index in positions:
        value = F.col(_criterion(index))
        if isinstance(kinds[index], ArrayType):
            listed = F.coalesce(value, F.array().cast("array<string>"))
            pairs.append(F.transform(listed, _tagged(index)))
        else:
            pairs.append(F.array(F.struct(F.lit(index), value)))
    named = "struct<c:int,v:string>"
    exploded = sample.select(
        F.explode(F.concat(*(pair.cast(f"array<{named}>") for pair in pairs))).alias("p")
    ).select("p.c", "p.v")
    least = max(2, min(listeners, CODE_SAMPLE) // CODE_SHARE)
    rows = (
        exploded.where(F.col("v").isNotNull())
        .groupBy("c", "v")
        .count()
        .where(F.col("count") >= least)
        .collect()
    )
    found: dict[int, list[tuple[int, str]]] = {}
    for row in rows:
        found.setdefault(int(row["c"]), []).append((-int(row["count"]), str(row["v"])))
    tables: list[tuple[str, ...] | None] = [None] * len(kinds)
    for index, counted in found.items():
        tables[index] = tuple(text for _, text in sorted(counted)[:MAX_CODES])
    return tuple(tables) if any(tables) else None


def _tagged(index: int) -> Callable[[Column], Column]:
    """For ``transform``: an item as the (column, string) pair that :func:`code_tables` counts
    (a named function: ``transform`` tells its one- and two-argument forms apart)."""
    return lambda item: F.struct(F.lit(index), item)


def _encoder(table: tuple[str, ...]) -> Callable[[Column], Column]:
    """For ``transform``: a list's string as its code, or as JSON."""
    return lambda item: _coded(item, table, _scalar_json(item))


def _coded(text: Column, table: tuple[str, ...] | None, json: Column) -> Column:
    """A string's code in ``table`` if it has one, else its JSON (``json``)."""
    if not table:
        return json
    position = F.array_position(F.array(*(F.lit(s) for s in table)), text)
    # nullif looks the string up once (a branch's value is not a common subexpression)
    return F.coalesce((F.nullif(position, F.lit(0)) - 1).cast("string"), json)


def _scalar_json(text: Column) -> Column:
    in_array = F.to_json(F.array(text))  # "[v]", "[null]": Spark's JSON of a scalar
    return F.substr(in_array, F.lit(2), F.length(in_array) - 2)


def shape(
    prepared: DataFrame, kinds: list[DataType], codes: Codes | None = None, *, digest: bool = False
) -> DataFrame:
    """``field`` and ``value`` (and with ``digest``, :func:`digest_of`) for each row of
    :func:`prepare`'s result.

    ``value`` is the JSON array of the row's criteria values in the order of
    :func:`criteria_keys` (``null`` for a NULL, trailing ``null``s left out), the strings of a
    column with ``codes`` as their code where they have one.
    """
    values: list[Column] = []  # each value's JSON, "null" for a NULL
    present: list[Column] = []  # its position if it is not NULL
    for index, kind in enumerate(kinds):
        value = F.col(_criterion(index))
        table = codes[index] if codes is not None else None
        there = value.isNotNull() if codable(kind) else value != F.lit("null")
        present.append(F.when(there, index + 1))
        if not codable(kind):
            values.append(value)  # its JSON already
        elif isinstance(kind, ArrayType):
            if table:
                items = F.transform(value, _encoder(table))
                listed = F.concat(F.lit("["), F.array_join(items, ","), F.lit("]"))
            else:
                listed = F.to_json(value)
            values.append(F.coalesce(listed, F.lit("null")))
        else:
            values.append(_coded(value, table, _scalar_json(value)))
    # Trailing NULLs left out: the values up to the last one present (no regular expression,
    # which cost ~1 µs a value).
    if not values:
        criteria = F.lit("[]")
    else:
        last = F.greatest(*present) if len(present) > 1 else present[0]
        listed = F.slice(F.array(*values), 1, F.coalesce(last, F.lit(0)))
        criteria = F.concat(F.lit("["), F.array_join(listed, ","), F.lit("]"))
    extra = [digest_of(kinds).alias("digest")] if digest else []
    return prepared.select("field", criteria.alias("value"), *extra)


def digest_of(kinds: list[DataType]) -> Column:
    """A hash of a row of :func:`prepare`'s criteria, for incremental runs to find the listeners
    whose criteria changed (without making their values: within one snapshot, the same criteria
    make the same value, as an incremental run writes with the live snapshot's codes)."""
    parts: list[Column] = []
    for index in range(len(kinds)):
        value = F.col(_criterion(index))
        parts += [value.isNull(), value]  # xxhash64 skips NULLs: (NULL, "a") is not ("a", NULL)
    return F.xxhash64(*parts) if parts else F.xxhash64(F.lit(0))


def _bulk(text: Column) -> Column:
    """A RESP bulk string: ``$<bytes>\\r\\n<text>\\r\\n``."""
    return F.concat(
        F.lit("$"), F.octet_length(text).cast("string"), F.lit(_CRLF), text, F.lit(_CRLF)
    )


def bucket_of(field: Column, buckets: int) -> Column:
    """``crc32(field) mod buckets``, as :func:`bow_gateway.core.criteria_snapshot.bucket_of`
    does."""
    return F.pmod(F.crc32(field.cast("binary")), F.lit(buckets))


def entries(shaped: DataFrame, buckets: int) -> DataFrame:
    """Each listener's ``HSET`` arguments (``$field $value`` in RESP), its bucket, and the bytes
    of its value (``size``: the writers report the longest).

    No shuffle: each executor groups the rows of its partitions by bucket itself
    (:mod:`bow_gateway.job.writer`), several ``HSET`` per bucket at most.
    """
    return shaped.select(
        bucket_of(F.col("field"), buckets).cast("int").alias("bucket"),
        F.concat(_bulk(F.col("field")), _bulk(F.col("value"))).cast("binary").alias("entry"),
        F.lit(0).cast("byte").alias("op"),
        F.lit(None).cast("string").alias("notify"),
        F.octet_length("value").alias("size"),
    )


def changes(diff: DataFrame, buckets: int) -> DataFrame:
    """``HSET`` arguments for each changed listener, ``HDEL`` for each removed one (op 1).

    ``diff`` has ``field`` and ``value`` (NULL: the listener disappeared); every row's field is
    also to be notified.
    """
    removed = F.col("value").isNull()
    entry = F.when(removed, _bulk(F.col("field"))).otherwise(
        F.concat(_bulk(F.col("field")), _bulk(F.col("value")))
    )
    return diff.select(
        bucket_of(F.col("field"), buckets).cast("int").alias("bucket"),
        entry.cast("binary").alias("entry"),
        F.when(removed, 1).otherwise(0).cast("byte").alias("op"),
        F.col("field").alias("notify"),
        F.coalesce(F.octet_length("value"), F.lit(0)).alias("size"),
    )
