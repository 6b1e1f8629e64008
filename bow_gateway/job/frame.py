"""From the criteria query's rows to Redis commands, all in Spark SQL (nothing per row in Python).

:func:`shape` checks the query's column types against the gateway's rules before anything runs,
and turns each row into ``field`` (the listener id as JSON), ``value`` (its criteria as compact
JSON: NULLs dropped, lists de-duplicated and sorted so that equal criteria are equal bytes) and
``problem`` (why the row breaks the gateway's rules, or NULL). :func:`bucket_commands` and
:func:`change_commands` build the RESP bytes of ``HSET``/``HDEL`` commands with ``concat``.
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

from ..criteria import ID_KEY

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


def shape(frame: DataFrame) -> DataFrame:
    """``field``, ``value`` and ``problem`` for each row of the criteria query's result.

    ``value`` is the JSON array of the row's criteria values in the order of
    :func:`criteria_keys` (``null`` for a NULL, trailing ``null``s left out).
    """
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
    values: list[Column] = []  # each value's JSON, "null" for a NULL
    for name, kind in columns:
        value = _col(name)
        if isinstance(kind, ArrayType):
            item = kind.elementType
            is_bad = _is_bad(item)
            if is_bad is not None:
                bad = F.exists(value, is_bad)
                problems.append(F.when(bad, f"column {name!r} holds {_what(item)}"))
            cleaned = F.array_sort(F.array_distinct(F.filter(value, lambda x: x.isNotNull())))
            value = F.when(F.size(cleaned) > 0, cleaned)  # an empty list matches nothing
            values.append(F.coalesce(F.to_json(value), F.lit("null")))
        else:
            is_bad = _is_bad(kind)
            if is_bad is not None:
                problems.append(F.when(is_bad(value), f"column {name!r} is {_what(kind)}"))
            in_array = F.to_json(F.array(value))  # "[v]", "[null]": Spark's JSON of a scalar
            values.append(F.substr(in_array, F.lit(2), F.length(in_array) - 2))
    # Only a JSON null can end in "null]": strings end in '"', numbers in digits.
    criteria = F.regexp_replace(
        F.concat(F.lit("["), F.concat_ws(",", *values), F.lit("]")), r"(,?null)+\]$", "]"
    )
    return frame.select(
        id_json.alias("bow_id_json"),
        criteria.alias("value"),
        (F.coalesce(*problems) if len(problems) > 1 else problems[0]).alias("problem"),
    ).select(field.alias("field"), "value", "problem")


def _bulk(text: Column) -> Column:
    """A RESP bulk string: ``$<bytes>\\r\\n<text>\\r\\n``."""
    return F.concat(
        F.lit("$"), F.octet_length(text).cast("string"), F.lit(_CRLF), text, F.lit(_CRLF)
    )


def bucket_of(field: Column, buckets: int) -> Column:
    """``crc32(field) mod buckets``, as :func:`bow_gateway.criteria_snapshot.bucket_of` does."""
    return F.pmod(F.crc32(field.cast("binary")), F.lit(buckets))


def entries(shaped: DataFrame, buckets: int) -> DataFrame:
    """Each listener's ``HSET`` arguments (``$field $value`` in RESP) and its bucket.

    No shuffle: each executor groups the rows of its partitions by bucket itself
    (:mod:`bow_gateway.job.writer`), several ``HSET`` per bucket at most.
    """
    return shaped.select(
        bucket_of(F.col("field"), buckets).cast("int").alias("bucket"),
        F.concat(_bulk(F.col("field")), _bulk(F.col("value"))).cast("binary").alias("entry"),
        F.lit(0).cast("byte").alias("op"),
        F.lit(None).cast("string").alias("notify"),
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
    )
