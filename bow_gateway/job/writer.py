"""The criteria job's writers, in the executors: Spark SQL's RESP bytes, grouped and streamed.

Spark SQL builds each listener's command arguments as RESP bytes (``$field $value``); a writer
takes the rows of its partition as Arrow batches, sorts them by bucket (in Arrow, not row by row
in Python), and sends one ``HSET key field value field value ...`` per bucket and run of rows,
in large pipelined writes: Python touches each bucket, never each listener. No shuffle groups the
rows beforehand, so a bucket may get one ``HSET`` from each partition that holds some of its
listeners.

Self-contained on purpose (redis-py, pyarrow and numpy only): the job ships this module and
:mod:`bow_gateway.runtime.redis_client` to the executors by value (cloudpickle), so that they need
neither the gateway nor its dependencies, and a Python worker starts without importing them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

from ..runtime.redis_client import RedisSettings, sync_redis_client

if TYPE_CHECKING:
    import pyarrow

STATS: Final = ("commands", "listeners", "removed", "longest")
"""The columns of :func:`write_partition`'s output, one row per partition: commands sent,
listeners written and removed, the bytes of the longest value written (of the ``size`` column)."""

HSET: Final = 0
HDEL: Final = 1
"""The ``op`` column: the arguments are ``$field $value`` for ``HSET``, ``$field`` for ``HDEL``."""

FLUSH_BYTES: Final = 1 << 20
"""A writer sends its commands in writes of about this many bytes, then reads their replies."""
GROUP_ROWS: Final = 262_144
GROUP_BYTES: Final = 64 << 20
"""Rows are grouped by bucket in sets of at most this many rows or bytes (Arrow's int32 offsets
also cap a binary column at 2 GiB)."""


def write_partition(
    batches: Iterator[pyarrow.RecordBatch],
    *,
    redis: RedisSettings,
    prefix: str,
    channel: str | None = None,
    notify_chunk: int = 1000,
    client_defaults: dict[str, Any] | None = None,
) -> Iterator[pyarrow.RecordBatch]:
    """Write a partition's rows (``bucket``, ``entry``, ``op``, ``notify`` and optionally ``size``,
    the bytes of the value); one stats row out.

    The key of bucket ``b`` is ``prefix + str(b)``; ``redis`` are the job's Redis settings (on a
    Redis Cluster, each bucket's commands go to the node that holds it). When ``channel`` is
    given, the ``notify`` column's fields (listener ids as JSON) are published there once the
    writes are done, as ``{"ids": [...]}`` in chunks of ``notify_chunk`` ids. A Redis error
    raises, which fails the task (and the job, which then switches nothing).
    """
    import numpy
    import pyarrow
    import pyarrow.compute

    client = sync_redis_client(redis, defaults=client_defaults)
    writer = _Writer(_Connections(client), prefix.encode())
    notify: list[str] = []
    held: list[pyarrow.RecordBatch] = []
    held_rows = held_bytes = longest = 0
    try:
        for batch in batches:
            if batch.num_rows and "size" in batch.schema.names:
                longest = max(longest, int(_values(batch.column("size"), numpy.int32).max()))
            if channel is not None:
                notify.extend(pyarrow.compute.drop_null(batch.column("notify")).to_pylist())
            held.append(batch)
            held_rows += batch.num_rows
            held_bytes += batch.nbytes
            if held_rows >= GROUP_ROWS or held_bytes >= GROUP_BYTES:
                writer.write(held)
                held, held_rows, held_bytes = [], 0, 0
        writer.write(held)
        writer.flush(last=True)
        for start in range(0, len(notify), notify_chunk):
            message = '{"ids":[' + ",".join(notify[start : start + notify_chunk]) + "]}"
            connection = writer.connections.any()
            connection.send_command("PUBLISH", channel, message)
            connection.read_response()
    finally:
        writer.connections.release()
        client.close()
    yield pyarrow.RecordBatch.from_arrays(
        [
            _one_int64(writer.commands),
            _one_int64(writer.listeners),
            _one_int64(writer.removed),
            _one_int64(longest),
        ],
        schema=pyarrow.schema([(name, pyarrow.int64()) for name in STATS]),
    )


# pyarrow imports pandas (~0.5 s, in every Python worker) as soon as it converts Python or numpy
# values (pyarrow.array, from_pydict) or makes numpy arrays (to_numpy): the writers never do.


def _one_int64(value: int) -> pyarrow.Array:
    """A one-value int64 Arrow array, made from its buffer (see above)."""
    import numpy
    import pyarrow

    data = pyarrow.py_buffer(numpy.array([value], dtype=numpy.int64))
    return pyarrow.Array.from_buffers(pyarrow.int64(), 1, [None, data])


def _values(array: pyarrow.Array, dtype: Any) -> Any:
    """The values of a fixed-width Arrow array without NULLs, as a numpy view (see above)."""
    import numpy

    return numpy.frombuffer(array.buffers()[1], dtype=dtype)[
        array.offset : array.offset + len(array)
    ]


class _Connections:
    """One connection per Redis server the keys live on: the one server, or a cluster's nodes."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cluster = not hasattr(client, "connection_pool")  # a RedisCluster has none
        self.taken: dict[str, tuple[Any, Any]] = {}  # server -> (its pool, our connection)

    def for_key(self, key: bytes) -> tuple[str, Any]:
        """The server that holds ``key`` (its name) and our connection to it."""
        if self.cluster:
            node = self.client.get_node_from_key(key)
            name, pool = node.name, node.redis_connection.connection_pool
        else:
            name, pool = "", self.client.connection_pool
        if name not in self.taken:
            self.taken[name] = (pool, pool.get_connection())
        return name, self.taken[name][1]

    def any(self) -> Any:
        """A connection to some server of the deployment (for ``PUBLISH``)."""
        if not self.taken:
            return self.for_key(b"")[1]
        return next(iter(self.taken.values()))[1]

    def release(self) -> None:
        for pool, connection in self.taken.values():
            pool.release(connection)
        self.taken.clear()


class _Pipe:
    """Commands to one server, sent in pipelined writes of about :data:`FLUSH_BYTES`."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.pending: list[Any] = []
        self.size = 0
        self.waiting = 0  # commands pending, not sent yet
        self.in_flight = 0  # commands sent whose replies are still to read
        self.commands = 0

    def add(self, header: bytes, body: Any) -> None:
        self.pending += (header, body)
        self.size += len(header) + len(body)
        self.waiting += 1
        if self.size >= FLUSH_BYTES:
            self.flush()

    def flush(self, last: bool = False) -> None:
        """Send what is pending in one write, then read the replies to the previous write.

        One write stays in flight while the next is prepared, so that Redis and this writer
        work at the same time; ``last`` reads every reply. An error reply raises: the task fails.
        """
        if self.pending:
            self.connection.send_packed_command([b"".join(self.pending)], check_health=False)
        for _ in range(self.in_flight):
            self.connection.read_response()
        self.commands += self.in_flight
        self.in_flight, self.waiting = self.waiting, 0
        self.pending, self.size = [], 0
        if last and self.in_flight:
            self.flush()


class _Writer:
    """One command per bucket and run of rows, each to the pipe of the server holding it."""

    def __init__(self, connections: _Connections, prefix: bytes) -> None:
        self.connections = connections
        self.prefix = prefix
        self.pipes: dict[str, _Pipe] = {}
        self.listeners = self.removed = 0

    @property
    def commands(self) -> int:
        return sum(pipe.commands for pipe in self.pipes.values())

    def pipe_for(self, key: bytes) -> _Pipe:
        name, connection = self.connections.for_key(key)
        if name not in self.pipes:
            self.pipes[name] = _Pipe(connection)
        return self.pipes[name]

    def write(self, batches: list[pyarrow.RecordBatch]) -> None:
        """One command per (op, bucket) among these rows; the bytes come straight from Arrow."""
        import numpy
        import pyarrow
        import pyarrow.compute

        if not batches:
            return
        table = pyarrow.Table.from_batches(batches).select(["op", "bucket", "entry"])
        order = pyarrow.compute.sort_indices(
            table, sort_keys=[("op", "ascending"), ("bucket", "ascending")]
        )
        table = table.take(order).combine_chunks()
        ops = _values(table.column("op").chunk(0), numpy.int8)
        buckets = _values(table.column("bucket").chunk(0), numpy.int32)
        entry = table.column("entry").chunk(0)
        width = numpy.int64 if pyarrow.types.is_large_binary(entry.type) else numpy.int32
        offsets = numpy.frombuffer(entry.buffers()[1], dtype=width)[
            entry.offset : entry.offset + len(entry) + 1
        ]
        data = memoryview(entry.buffers()[2])
        count = len(ops)
        if count == 0:  # every batch held was empty
            return
        bounds = numpy.flatnonzero((numpy.diff(buckets) != 0) | (numpy.diff(ops) != 0)) + 1
        starts = [0, *bounds.tolist()]
        ends = [*bounds.tolist(), count]
        for start, end in zip(starts, ends, strict=True):
            rows = end - start
            key = self.prefix + str(buckets[start]).encode()
            if ops[start] == HSET:
                header = b"*%d\r\n$4\r\nHSET\r\n$%d\r\n%s\r\n" % (2 + 2 * rows, len(key), key)
                self.listeners += rows
            else:
                header = b"*%d\r\n$4\r\nHDEL\r\n$%d\r\n%s\r\n" % (2 + rows, len(key), key)
                self.removed += rows
            self.pipe_for(key).add(header, data[offsets[start] : offsets[end]])

    def flush(self, last: bool = False) -> None:
        for pipe in self.pipes.values():
            pipe.flush(last)
