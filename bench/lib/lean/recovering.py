"""A protocol-2 lean client that keeps every event it receives: what recovering costs and gives."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from lib.lean.books import EVENT, Books, Message
from lib.lean.websocket import LeanClient


class RecoveringClient(LeanClient):
    """A protocol-2 lean client that keeps every event it receives: ``(position, replayed)``.

    ``done`` resolves once the ack has come and ``expected`` replayed events have been read (at
    once after the ack when ``expected`` is 0 or the ack says ``recovered`` is not true).
    """

    def __init__(self, host: str, token: str, options: dict[str, Any], expected: int = 0) -> None:
        super().__init__(Books(), host, token, proto=2, options=options)
        self.expected = expected
        self.events: list[tuple[str | None, bool]] = []
        self.replayed = 0
        self.acked = False
        self.done: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def _acknowledged(self, payload: bytes) -> None:
        super()._acknowledged(payload)
        self.acked = True
        self._check()

    def _event(self, payload: bytes) -> Message | None:
        try:
            name, *args = json.loads(payload[2:])
        except ValueError:
            return None
        meta = args[1] if len(args) > 1 and isinstance(args[1], dict) else {}
        if name == EVENT:
            replayed = bool(meta.get("replayed"))
            self.events.append((meta.get("position"), replayed))
            self.position = meta.get("position") or self.position
            if replayed:
                self.replayed += 1
                self._check()
            return None
        return super()._event(payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self.books.closing = True
        super().connection_lost(exc)
        if not self.done.done():
            self.done.set_exception(ConnectionError(self.reason or "connection lost"))

    def _check(self) -> None:
        if self.done.done() or not self.acked:
            return
        result = self.result if isinstance(self.result, dict) else {}
        if self.replayed >= self.expected or result.get("recovered") is not True:
            self.done.set_result(time.perf_counter())
