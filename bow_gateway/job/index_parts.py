"""The audience index's work in the executors: partial bitmaps per partition, their union written
to Redis, the number -> id chunks written and read back.

Self-contained on purpose (redis-py, pyarrow, numpy, pyroaring and
:mod:`bow_gateway.core.audience_layout`): shipped to the executors by value, as
:mod:`.writer` is. Python touches each distinct value of a partition, not each listener: Arrow
groups the rows by value (``dictionary_encode``) and numpy hands each group's numbers to
pyroaring at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

from ..core.audience_layout import pair_token
from ..runtime.redis_client import RedisSettings, sync_redis_client

if TYPE_CHECKING:
    import pyarrow
    from pyroaring import BitMap

PARTS_SCHEMA: Final = "pair string, bits binary"
STATS_SCHEMA: Final = "pairs long, members long, bytes long"
PIPELINE: Final = 1000


def _values(array: pyarrow.Array, dtype: Any) -> Any:
    """The values of a fixed-width Arrow array without NULLs, as a numpy view."""
    import numpy

    return numpy.frombuffer(array.buffers()[1], dtype=dtype)[
        array.offset : array.offset + len(array)
    ]


def partial_bitmaps(
    batches: Iterator[pyarrow.RecordBatch], *, keys: list[str]
) -> Iterator[pyarrow.RecordBatch]:
    """Rows ``number`` then one column per key (booleans, whole numbers, doubles, strings or
    lists of those): out, a bitmap per pair of this partition.

    Each column's values and their listeners' numbers are gathered over the whole partition,
    then grouped once: Python touches each distinct value of the partition once."""
    import numpy
    import pyarrow

    gathered: list[tuple[list[pyarrow.Array], list[Any]]] = [([], []) for _ in keys]
    for batch in batches:
        if batch.num_rows:
            numbers = _values(batch.column(0), "int64").astype(numpy.uint32)
            for index, (values, owners) in enumerate(gathered):
                value, owner = _flat(batch.column(index + 1), numbers)
                values.append(value)
                owners.append(owner)
    found: dict[str, BitMap] = {}
    for key, (values, owners) in zip(keys, gathered, strict=True):
        if values:
            _add_column(found, key, pyarrow.concat_arrays(values), numpy.concatenate(owners))
    yield from _parts(found)


def _flat(column: pyarrow.Array, numbers: Any) -> tuple[pyarrow.Array, Any]:
    """A column's values (a list's items) and the number of the listener holding each."""
    import pyarrow.compute as pc
    import pyarrow.types

    if pyarrow.types.is_list(column.type) or pyarrow.types.is_large_list(column.type):
        parents = pc.list_parent_indices(column)
        owners = numbers[_values(parents, "int64" if parents.type.bit_width == 64 else "int32")]
        return pc.list_flatten(column), owners
    return column, numbers


def _add_column(found: dict[str, BitMap], key: str, column: pyarrow.Array, owners: Any) -> None:
    """Each distinct value's listeners of one column added to the bitmaps of its pairs."""
    import array

    import numpy
    import pyarrow.compute as pc
    from pyroaring import BitMap

    encoded = pc.dictionary_encode(column)
    indices = encoded.indices
    if indices.null_count:
        owners = owners[_valid(indices)]
        indices = pc.drop_null(indices)
    if not len(indices):
        return
    codes = _values(indices, "int32")
    order = numpy.argsort(codes, kind="stable")
    codes, owners = codes[order], owners[order]
    bounds = (numpy.flatnonzero(numpy.diff(codes)) + 1).tolist()
    values = encoded.dictionary.to_pylist()
    for start, end in zip([0, *bounds], [*bounds, len(codes)], strict=True):
        members = array.array("I", owners[start:end].tobytes())
        token = pair_token(key, values[codes[start]])
        held = found.get(token)
        if held is None:
            found[token] = BitMap(members)
        else:
            held.update(members)


def _valid(indices: pyarrow.Array) -> Any:
    """A numpy mask of the non-NULL items of an Arrow array."""
    import numpy
    import pyarrow.compute as pc

    return numpy.frombuffer(
        pc.is_valid(indices).cast("uint8").buffers()[1], dtype=numpy.uint8
    ).astype(bool)[: len(indices)]


def _parts(found: dict[str, BitMap]) -> Iterator[pyarrow.RecordBatch]:
    import pyarrow

    pairs = list(found)
    if pairs:
        bits = [found[pair].serialize() for pair in pairs]
        yield pyarrow.RecordBatch.from_arrays(
            [pyarrow.array(pairs, pyarrow.string()), pyarrow.array(bits, pyarrow.binary())],
            names=["pair", "bits"],
        )


def merge_and_write(
    batches: Iterator[pyarrow.RecordBatch],
    *,
    redis: RedisSettings,
    prefix: str,
    pairs_key: str,
    client_defaults: dict[str, Any] | None = None,
) -> Iterator[pyarrow.RecordBatch]:
    """Rows ``pair``, ``bits`` (a pair's rows all in this partition): their union, written at
    ``prefix + "b:" + pair``, and its count in ``pairs_key``; one stats row out."""
    from pyroaring import BitMap

    merged: dict[str, BitMap] = {}
    for batch in batches:
        for pair, bits in zip(
            batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True
        ):
            part = BitMap.deserialize(bits)
            held = merged.get(pair)
            if held is None:
                merged[pair] = part
            else:
                held |= part
    members = size = 0
    client = sync_redis_client(redis, defaults=client_defaults)
    try:
        pipe = client.pipeline(transaction=False)
        for count, (pair, bitmap) in enumerate(merged.items(), 1):
            bitmap.run_optimize()
            data = bitmap.serialize()
            members += len(bitmap)
            size += len(data)
            pipe.set(f"{prefix}b:{pair}", data)
            pipe.hset(pairs_key, pair, len(bitmap))
            if count % PIPELINE == 0:
                pipe.execute()
        pipe.execute()
    finally:
        client.close()
    yield _stats(len(merged), members, size)


def _stats(*values: int) -> pyarrow.RecordBatch:
    import pyarrow

    return pyarrow.RecordBatch.from_arrays(
        [pyarrow.array([value], pyarrow.int64()) for value in values],
        names=["pairs", "members", "bytes"],
    )


def write_chunks(
    batches: Iterator[pyarrow.RecordBatch],
    *,
    redis: RedisSettings,
    prefix: str,
    chunk: int,
    client_defaults: dict[str, Any] | None = None,
) -> Iterator[pyarrow.RecordBatch]:
    """Rows ``number``, ``field`` (a chunk's rows all in this partition): each chunk's ids, a
    line per number (empty for a hole), at ``prefix + "ids:" + chunk``; one stats row out."""
    lines: dict[int, list[str]] = {}
    for batch in batches:
        for number, field in zip(
            batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True
        ):
            held = lines.setdefault(number // chunk, [])
            offset = number % chunk
            if offset >= len(held):
                held.extend([""] * (offset + 1 - len(held)))
            held[offset] = field
    size = 0
    client = sync_redis_client(redis, defaults=client_defaults)
    try:
        pipe = client.pipeline(transaction=False)
        for index, held in lines.items():
            text = "\n".join(held).encode()
            size += len(text)
            pipe.set(f"{prefix}ids:{index}", text)
        pipe.execute()
    finally:
        client.close()
    yield _stats(len(lines), 0, size)


def read_chunks(
    batches: Iterator[pyarrow.RecordBatch],
    *,
    redis: RedisSettings,
    prefix: str,
    chunk: int,
    client_defaults: dict[str, Any] | None = None,
) -> Iterator[pyarrow.RecordBatch]:
    """Rows ``id`` (chunk numbers): out, ``field`` and ``number`` of each listener they hold."""
    import pyarrow

    client = sync_redis_client(redis, defaults=client_defaults)
    try:
        for batch in batches:
            indices = batch.column(0).to_pylist()
            pipe = client.pipeline(transaction=False)  # GETs: the chunks span cluster slots
            for index in indices:
                pipe.get(f"{prefix}ids:{index}")
            texts = pipe.execute() if indices else []
            fields: list[str] = []
            numbers: list[int] = []
            for index, text in zip(indices, texts, strict=True):
                for offset, field in enumerate((text or b"").decode().split("\n")):
                    if field:
                        fields.append(field)
                        numbers.append(index * chunk + offset)
            yield pyarrow.RecordBatch.from_arrays(
                [pyarrow.array(fields, pyarrow.string()), pyarrow.array(numbers, pyarrow.int64())],
                names=["field", "number"],
            )
    finally:
        client.close()


CHANGES_SCHEMA: Final = "pair string, removed boolean, bits binary"


def apply_changes(
    batches: Iterator[pyarrow.RecordBatch],
    *,
    redis: RedisSettings,
    previous: str,
    prefix: str,
    pairs_key: str,
    client_defaults: dict[str, Any] | None = None,
) -> Iterator[pyarrow.RecordBatch]:
    """Rows ``pair``, ``removed``, ``bits`` (a pair's rows all in this partition): each pair's
    bitmap of the generation at ``previous``, less its removed listeners, plus its added ones,
    written at ``prefix`` (or deleted there when empty); one stats row out."""
    from pyroaring import BitMap

    changes: dict[str, tuple[BitMap, BitMap]] = {}
    for batch in batches:
        columns = (batch.column(name).to_pylist() for name in ("pair", "removed", "bits"))
        for pair, removed, bits in zip(*columns, strict=True):
            held = changes.setdefault(pair, (BitMap(), BitMap()))
            held[0 if removed else 1].update(BitMap.deserialize(bits))
    members = size = 0
    client = sync_redis_client(redis, defaults=client_defaults)
    try:
        pairs = list(changes)
        for start in range(0, len(pairs), PIPELINE):
            some = pairs[start : start + PIPELINE]
            pipe = client.pipeline(transaction=False)
            for pair in some:
                pipe.get(f"{previous}b:{pair}")
            olds = pipe.execute()
            for pair, old in zip(some, olds, strict=True):
                removed, added = changes[pair]
                bitmap = (BitMap() if old is None else BitMap.deserialize(old)) - removed
                bitmap |= added
                if not bitmap:
                    pipe.delete(f"{prefix}b:{pair}")
                    pipe.hdel(pairs_key, pair)
                    continue
                bitmap.run_optimize()
                data = bitmap.serialize()
                members, size = members + len(bitmap), size + len(data)
                pipe.set(f"{prefix}b:{pair}", data)
                pipe.hset(pairs_key, pair, len(bitmap))
            pipe.execute()
    finally:
        client.close()
    yield _stats(len(changes), members, size)
