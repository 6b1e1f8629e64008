"""The criteria job's side of Redis: the lock, the snapshot registry, the switch, the writers.

:class:`SnapshotStore` runs on the Spark driver (redis-py, synchronous): one job at a time (a lock
renewed by a thread), snapshots registered before they are written so that a crashed run's keys
are found and removed by the next run, the live pointer switched with one ``SET`` only while the
lock is still ours, the previous snapshot left to expire after a grace period.

The executors' side is :mod:`bow_gateway.job.writer`.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from typing import Any, Final

import redis

from ..core.audience_layout import IndexLayout
from ..core.criteria_snapshot import Layout, Live, snapshot_message
from ..runtime.redis_client import SyncClient

logger = logging.getLogger(__name__)

_FAILURES = (redis.RedisError, redis.exceptions.RedisClusterException)

WRITING: Final = "writing"
LIVE: Final = "live"
RETIRED: Final = "retired"

_RENEW: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_SET_IF_LOCKED: Final = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
if #KEYS > 2 then
  if ARGV[5] == '' then redis.call('DEL', KEYS[3]) else redis.call('SET', KEYS[3], ARGV[5]) end
end
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], ARGV[4]) end
return 1
"""
"""Set the live pointer while the lock is ours, and notify in the same step (PUBLISH with a
channel name is allowed in a script on a Redis Cluster: channels are not keys); with a third key,
the audience index's pointer is set (or deleted, for an empty value) in the same step."""


class LockHeld(RuntimeError):
    """Another criteria job holds the lock."""


class LockLost(RuntimeError):
    """The lock expired or was taken while this job ran: it must not switch anything."""


class SnapshotStore:
    """Snapshot bookkeeping in Redis, for one job run (a context manager that holds the lock)."""

    def __init__(self, client: SyncClient, layout: Layout, *, lock_seconds: float = 60.0) -> None:
        self.client = client
        self.layout = layout
        self.token = secrets.token_hex(16)
        self._lock_ms = max(1000, int(lock_seconds * 1000))
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.lost = False
        self.index_pointer: str | None = None
        """The audience index pointer to switch with the criteria ("": delete it), if any."""

    # -- the lock -------------------------------------------------------------------------------

    def __enter__(self) -> SnapshotStore:
        if not self.client.set(self.layout.lock_key, self.token, nx=True, px=self._lock_ms):
            holder = self.client.pttl(self.layout.lock_key)
            raise LockHeld(
                f"another criteria job is running (the lock {self.layout.lock_key} is held"
                f" for {max(0, holder) / 1000:.0f} s more, renewed while that job runs)"
            )
        self._renewer = threading.Thread(target=self._renew, name="criteria-lock", daemon=True)
        self._renewer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        try:
            self.client.eval(_RELEASE, 1, self.layout.lock_key, self.token)
        except _FAILURES as error:  # it expires by itself
            logger.warning("could not release the lock %s: %s", self.layout.lock_key, error)

    def _renew(self) -> None:
        while not self._stop.wait(self._lock_ms / 3000):
            try:
                renewed = self.client.eval(
                    _RENEW, 1, self.layout.lock_key, self.token, self._lock_ms
                )
            except _FAILURES as error:
                logger.warning("could not renew the lock: %s", error)
                continue
            if not renewed:
                self.lost = True
                return

    def _set_if_locked(
        self, key: str, value: str, channel: str = "", message: str = "", index: bool = False
    ) -> None:
        keys = [self.layout.lock_key, key]
        arguments = [self.token, value, channel, message]
        if index and self.index_pointer is not None:
            keys.append(IndexLayout(self.layout.namespace).pointer_key)
            arguments.append(self.index_pointer)
        if self.lost or not self.client.eval(_SET_IF_LOCKED, len(keys), *keys, *arguments):
            self.lost = True
            raise LockLost(
                f"the lock {self.layout.lock_key} expired while this job ran (was it paused?):"
                " nothing was switched; raise lock_seconds if this happens again"
            )

    # -- snapshots ------------------------------------------------------------------------------

    def live(self) -> Live | None:
        return Live.from_json(self.client.get(self.layout.live_key))

    def registry(self) -> dict[str, dict[str, Any]]:
        raw = self.client.hgetall(self.layout.registry_key)
        return {
            (name.decode() if isinstance(name, bytes) else name): json.loads(value)
            for name, value in raw.items()
        }

    def clean_up(self, now: float | None = None) -> list[str]:
        """Remove what earlier runs left: a crashed run's partial snapshot, expired snapshots."""
        now = time.time() if now is None else now
        live = self.live()
        removed = []
        for snapshot, entry in self.registry().items():
            if live is not None and snapshot == live.snapshot:
                continue
            if entry.get("status") == RETIRED and entry.get("expires", 0) > now:
                continue
            self.discard(snapshot, int(entry["buckets"]))
            removed.append(snapshot)
        return removed

    def begin(self, snapshot: str, buckets: int) -> None:
        """Register a snapshot before writing it: if this run dies, the next one removes it."""
        entry = {"buckets": buckets, "status": WRITING, "started": time.time()}
        self.client.hset(self.layout.registry_key, snapshot, json.dumps(entry))

    def discard(self, snapshot: str, buckets: int) -> None:
        """Delete a snapshot's keys (``UNLINK``, in pipelined chunks) and forget it."""
        self._each_key(snapshot, buckets, "UNLINK")
        self.client.hdel(self.layout.registry_key, snapshot)

    def count(self, snapshot: str, buckets: int) -> int:
        """How many listeners a snapshot holds (``HLEN`` of every bucket, pipelined)."""
        return sum(self._each_key(snapshot, buckets, "HLEN"))

    def go_live(self, live: Live, previous: Live | None, grace_seconds: float) -> None:
        """Switch the live pointer and notify, in one script, only if we hold the lock.

        What follows the switch is bookkeeping: if it fails, the next run does it.
        """
        self._set_if_locked(
            self.layout.live_key,
            live.to_json(),
            self.layout.changes_channel,
            snapshot_message(live.snapshot),
            index=True,
        )
        try:
            entry = {"buckets": live.buckets, "status": LIVE, "since": time.time()}
            self.client.hset(self.layout.registry_key, live.snapshot, json.dumps(entry))
            if previous is not None and previous.snapshot != live.snapshot:
                self.retire(previous, grace_seconds)
        except _FAILURES as error:
            logger.warning("snapshot %s is live, but its bookkeeping failed: %s", live, error)

    def retire(self, previous: Live, grace_seconds: float) -> None:
        """Let a replaced snapshot expire once instances have moved on (``PEXPIRE``)."""
        if grace_seconds <= 0:
            self.discard(previous.snapshot, previous.buckets)
            return
        self._each_key(previous.snapshot, previous.buckets, "PEXPIRE", int(grace_seconds * 1000))
        entry = {
            "buckets": previous.buckets,
            "status": RETIRED,
            "expires": time.time() + grace_seconds,
        }
        self.client.hset(self.layout.registry_key, previous.snapshot, json.dumps(entry))

    def update_live(self, live: Live, *, index: bool = False) -> None:
        """Point at new job state for the same snapshot (after an incremental run); ``index``:
        switch the audience index too (:attr:`index_pointer`)."""
        self._set_if_locked(self.layout.live_key, live.to_json(), index=index)

    def _each_key(self, snapshot: str, buckets: int, command: str, *args: Any) -> list[Any]:
        replies: list[Any] = []
        for start in range(0, buckets, 1000):
            pipe = self.client.pipeline(transaction=False)
            for bucket in range(start, min(buckets, start + 1000)):
                pipe.execute_command(command, self.layout.bucket_key(snapshot, bucket), *args)
            replies.extend(pipe.execute())
        return replies


def new_snapshot_id() -> str:
    """A sortable, unique snapshot name: the UTC time and a random suffix."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + secrets.token_hex(2)


def listpack_warnings(client: SyncClient, longest: int, listeners_per_bucket: int) -> list[str]:
    """What to say when Redis would store buckets as hash tables (~2x the memory of listpacks):
    criteria values up to ``longest`` bytes, about ``listeners_per_bucket`` per bucket."""
    limits: dict[str, int] = {}
    for name in ("entries", "value"):
        for spelling in (f"hash-max-listpack-{name}", f"hash-max-ziplist-{name}"):
            try:
                reply = client.config_get(spelling)
            except Exception:  # noqa: BLE001 - CONFIG may be disabled (managed Redis): no advice
                return []
            if spelling in reply:
                limits[name] = int(str(reply[spelling]))
                break
    warnings = []
    if "value" in limits and longest > limits["value"]:
        warnings.append(
            f"warning: criteria up to {longest} bytes exceed the Redis setting"
            f" hash-max-listpack-value {limits['value']}: buckets holding them take more"
            " memory; raise it (see docs/criteria-job.md)"
        )
    if "entries" in limits and listeners_per_bucket * 1.5 > limits["entries"]:
        warnings.append(
            f"warning: about {listeners_per_bucket} listeners per bucket (up to"
            f" ~{int(listeners_per_bucket * 1.5)}) exceed hash-max-listpack-entries"
            f" {limits['entries']}: raise it or lower snapshot.listeners_per_bucket"
        )
    return warnings
