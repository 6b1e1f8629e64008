"""The criteria job's writer as a Spark executor's Python worker runs it: Arrow batches from an
IPC stream, a real ``redis-server``, and a fresh interpreter that must not import pandas (which
pyarrow imports as soon as it converts values: ~0.5 s in every Python worker)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow
import pyarrow.ipc
import pytest
import redis

from .support.redis_server import RedisServer

pytestmark = pytest.mark.spark

WORKER = """
import json, sys
import pyarrow.ipc
from bow_gateway.job.writer import write_partition

batches = [pyarrow.ipc.open_file(sys.argv[1]).get_batch(0)]
stats = next(write_partition(iter(batches), redis=sys.argv[2], prefix="p:", channel="changes"))
print(json.dumps({"stats": stats.to_pylist(), "pandas": "pandas" in sys.modules}))
"""


def resp(*parts: str) -> bytes:
    return b"".join(b"$%d\r\n%s\r\n" % (len(p.encode()), p.encode()) for p in parts)


def test_a_writer_writes_its_rows_and_never_imports_pandas(tmp_path: Path) -> None:
    rows = [  # bucket, entry, op (0: HSET field value, 1: HDEL field), notify, value's bytes
        (1, resp('"a"', '["x"]'), 0, '"a"', 5),
        (0, resp('"b"', "[1]"), 0, '"b"', 3),
        (1, resp('"c"', "[true]"), 0, '"c"', 6),
        (0, resp('"gone"'), 1, '"gone"', 0),
    ]
    columns = list(zip(*rows, strict=True))
    batch = pyarrow.RecordBatch.from_arrays(
        [
            pyarrow.array(columns[0], pyarrow.int32()),
            pyarrow.array(columns[1], pyarrow.binary()),
            pyarrow.array(columns[2], pyarrow.int8()),
            pyarrow.array(columns[3], pyarrow.string()),
            pyarrow.array(columns[4], pyarrow.int32()),
        ],
        names=["bucket", "entry", "op", "notify", "size"],
    )
    path = tmp_path / "batches.arrow"
    with pyarrow.ipc.new_file(str(path), batch.schema) as file:
        file.write_batch(batch)
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        client.hset("p:0", '"gone"', "[0]")
        listening = client.pubsub()  # type: ignore[no-untyped-call]
        listening.subscribe("changes")
        done = subprocess.run(
            [sys.executable, "-c", WORKER, str(path), server.url],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert client.hgetall("p:0") == {b'"b"': b"[1]"}
        assert client.hgetall("p:1") == {b'"a"': b'["x"]', b'"c"': b"[true]"}
        heard = [listening.get_message(timeout=1) for _ in range(2)][-1]
        listening.close()
        client.close()
    report = json.loads(done.stdout)
    assert report["stats"] == [{"commands": 3, "listeners": 3, "removed": 1, "longest": 6}]
    assert report["pandas"] is False
    assert heard is not None and json.loads(heard["data"]) == {"ids": ["a", "b", "c", "gone"]}
