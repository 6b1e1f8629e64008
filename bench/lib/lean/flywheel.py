"""The lean Flywheel client (``docs/flywheel.md``): a plain websocket, binds and ``R`` frames."""

from __future__ import annotations

import json
from collections.abc import Sequence

from lib import gateway
from lib.lean.books import EVENT, EVENT_BYTES, Books, Message
from lib.lean.websocket import LeanClient

FLYWHEEL_PATH = f"/broker?v={gateway.OUTBOUND_VERSION}"


class FlywheelClient(LeanClient):
    """One Flywheel connection (``docs/flywheel.md``) over a plain websocket, lean as
    :class:`LeanClient`: upgrade on ``/broker?v=...``, ``B {"auth": {"type": "Bearer", "token"},
    "subscribe": [...]}``, ready at a ``BindResponse`` without errors, then every ``R {topic}
    {body}`` frame of the benchmark counted as Socket.IO's events are (the first copy of a frame
    is parsed, the others found by their bytes). It answers the gateway's websocket pings."""

    def __init__(
        self, books: Books, host: str, token: str, subscribe: Sequence[str] = (EVENT,)
    ) -> None:
        super().__init__(books, host, token, proto=2)
        self.subscribe = list(subscribe)
        self._bound = False

    def _path(self) -> str:
        return FLYWHEEL_PATH

    def _upgrade(self, data: bytes) -> bytes:
        rest = super()._upgrade(data)
        if self._upgraded and not self._bound:
            self._bound = True
            bind = {"auth": {"type": "Bearer", "token": self.token}, "subscribe": self.subscribe}
            self._send(b"B " + json.dumps(bind).encode())
        return rest

    def _packet(self, opcode: int, payload: bytes) -> Message | None:
        if opcode != 0x1:  # close, ping: as any websocket
            return super()._packet(opcode, payload)
        if payload.startswith(b"R "):
            topic, _, body = payload[2:].partition(b" ")
            if topic == EVENT_BYTES:
                try:
                    return self.books.first_receipt(payload, json.loads(body))
                except ValueError:
                    return None
            self.reason = f"Flywheel {payload[:200]!r}"  # $remote/.../rx/alerts or errors
        elif payload.startswith(b"B "):
            try:
                errors = json.loads(payload[2:]).get("errors")
            except (ValueError, AttributeError):
                errors = [f"not a BindResponse: {payload[:200]!r}"]
            if errors:
                self.reason = f"bind refused: {errors}"
            elif not self.ready.done():
                self.ready.set_result(None)
        else:
            self.reason = f"Flywheel {payload[:200]!r}"
        return None
