"""What an inbound's ``204`` says of what it accepted (contract sections 2, 7 and 16): the last
message's position, every message's id; and the refusals every way in shares."""

from __future__ import annotations

from typing import Final, NamedTuple

from aiohttp import hdrs, web

POSITION_HEADER: Final = "Bow-Position"
"""The ``204``'s header: the accepted event's position, as sockets get it in ``meta.position``."""
MESSAGE_ID_HEADER: Final = "Bow-Message-Id"
"""The ``204``'s header: the accepted message's id, as sockets get it in ``meta.id``."""
MESSAGE_IDS_HEADER: Final = "Bow-Message-Ids"
"""A batch's ``204``: its messages' ids, in order, separated by ``, ``."""


class Accepted(NamedTuple):
    """What a request published: the last message's position, every message's id, and whether
    the function returned a batch (then ``Bow-Message-Ids``, even for one)."""

    position: str
    ids: list[str]
    batch: bool

    def headers(self) -> dict[str, str]:
        """The ``204``'s headers: ``Bow-Position``, and ``Bow-Message-Id`` or (a batch)
        ``Bow-Message-Ids``, the ids in order separated by ``, ``."""
        if self.batch:
            return {POSITION_HEADER: self.position, MESSAGE_IDS_HEADER: ", ".join(self.ids)}
        return {POSITION_HEADER: self.position, MESSAGE_ID_HEADER: self.ids[0]}

    def head(self) -> bytes:
        """The ``204``'s status line and these headers, for the fast path (one format: the
        commonest answer the gateway writes)."""
        if self.batch:
            ids = f"{MESSAGE_IDS_HEADER}: {', '.join(self.ids)}"
        else:
            ids = f"{MESSAGE_ID_HEADER}: {self.ids[0]}"
        return (
            f"HTTP/1.1 204 No Content\r\n{POSITION_HEADER}: {self.position}\r\n{ids}\r\n".encode()
        )


def unprocessable(reason: str, limit: int = 2_000) -> web.HTTPException:
    if len(reason) > limit:  # a message function's own words may be long
        reason = reason[:limit] + f"... ({len(reason) - limit} more characters)"
    return web.HTTPUnprocessableEntity(text=f"422: {reason}")


def unavailable(retry_after: float) -> web.HTTPException:
    """``503``: nothing internal in the body (a Redis address); the log gets the cause."""
    return web.HTTPServiceUnavailable(
        text="503: the gateway cannot take messages now: retry later",
        headers={hdrs.RETRY_AFTER: str(max(1, round(retry_after)))},
    )
