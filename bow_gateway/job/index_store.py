"""The audience index's generations in Redis, on the Spark driver: registered before they are
written (a crashed run's keys are found and removed by the next run), retired with a grace period
once a newer one is live. The switch itself is :class:`.store.SnapshotStore`'s, with the
criteria's."""

from __future__ import annotations

import json
import re
import time
from typing import Any, Final

import redis

from ..core.audience_layout import IndexLayout, IndexPointer
from ..runtime.redis_client import SyncClient

WRITING: Final = "writing"
LIVE: Final = "live"
RETIRED: Final = "retired"


class IndexStore:
    """The generations of one namespace's audience index."""

    def __init__(self, client: SyncClient, layout: IndexLayout) -> None:
        self.client = client
        self.layout = layout

    def live(self) -> IndexPointer | None:
        return IndexPointer.from_json(self.client.get(self.layout.pointer_key))

    def registry(self) -> dict[str, dict[str, Any]]:
        raw = self.client.hgetall(self.layout.registry_key)
        return {(k.decode() if isinstance(k, bytes) else k): json.loads(v) for k, v in raw.items()}

    def begin(self, generation: str) -> None:
        """Register a generation before writing it."""
        entry = {"status": WRITING, "started": time.time()}
        self.client.hset(self.layout.registry_key, generation, json.dumps(entry))

    def clean_up(self, now: float | None = None) -> list[str]:
        """Remove what earlier runs left: unfinished generations, expired ones."""
        now = time.time() if now is None else now
        live = self.live()
        removed = []
        for generation, entry in self.registry().items():
            if live is not None and generation == live.generation:
                continue
            if entry.get("status") == RETIRED and entry.get("expires", 0) > now:
                continue
            self.discard(generation)
            removed.append(generation)
        return removed

    def abandon(self, generation: str) -> None:
        """Remove a generation that did not go live (a live one is left alone; if this fails
        too, the next run removes it)."""
        try:
            live = self.live()
            if live is None or live.generation != generation:
                self.discard(generation)
        except (redis.RedisError, redis.exceptions.RedisClusterException, ValueError):
            pass

    def discard(self, generation: str) -> None:
        """Delete a generation's keys and forget it."""
        self._each_key(generation, "UNLINK")
        self.client.hdel(self.layout.registry_key, generation)

    def went_live(
        self, pointer: IndexPointer | None, previous: IndexPointer | None, grace_seconds: float
    ) -> None:
        """Bookkeeping once ``pointer`` is live (``None``: the index was turned off)."""
        if pointer is not None:
            entry = {"status": LIVE, "since": time.time()}
            self.client.hset(self.layout.registry_key, pointer.generation, json.dumps(entry))
        if previous is None or (pointer is not None and previous.generation == pointer.generation):
            return
        if grace_seconds <= 0:
            self.discard(previous.generation)
            return
        self._each_key(previous.generation, "PEXPIRE", int(grace_seconds * 1000))
        entry = {"status": RETIRED, "expires": time.time() + grace_seconds}
        self.client.hset(self.layout.registry_key, previous.generation, json.dumps(entry))

    def _each_key(self, generation: str, command: str, *args: Any) -> None:
        """``command`` on every key of a generation (found with ``SCAN``), pipelined."""
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self.layout.prefix(generation)) + "*"
        pipe = self.client.pipeline(transaction=False)
        for count, key in enumerate(self.client.scan_iter(match=pattern, count=1000), 1):
            pipe.execute_command(command, key, *args)
            if count % 1000 == 0:
                pipe.execute()
        pipe.execute()
