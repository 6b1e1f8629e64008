"""The codes of section 10: why a socket is refused, alerted or closed, and what its client
should do (the same codes close the plain-WebSocket outbounds); :class:`TokenExpired`, what an
outbound raises for an expired token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

ADVICE: Final = ("now", "backoff", "new_token", "never")
"""What a client should do after a code: reconnect now, with exponential backoff (1 s up to at
least 30 s), with a new token (then recover), or never (a client bug)."""


@dataclass(frozen=True, slots=True)
class Code:
    """A code, its reason (a word clients can switch on) and the advice that comes with it."""

    code: int
    reason: str
    reconnect: str

    def info(self, *, fatal: bool = True, reconnect: str | None = None) -> dict[str, Any]:
        """The ``info`` of an ``alert``: ``{"code", "reason", "fatal", "reconnect"}``."""
        return {
            "code": self.code,
            "reason": self.reason,
            "fatal": fatal,
            "reconnect": reconnect or self.reconnect,
        }

    def data(self) -> dict[str, Any]:
        """The ``data`` of a ``connect_error``: ``{"code", "reason", "reconnect"}``."""
        return {"code": self.code, "reason": self.reason, "reconnect": self.reconnect}


class TokenExpired(ValueError):
    """Raised by an outbound's ``create_listener_details_from_token`` for a token whose expiry
    has passed (the bundled JWT outbound does): refused with 4003 ``token_expired``, where any
    other error is 4002 ``auth_refused``, so that a client fetches a new token rather than
    retrying this one."""


BAD_REQUEST: Final = Code(4000, "bad_request", "never")
AUTH_TIMEOUT: Final = Code(4001, "auth_timeout", "now")
AUTH_REFUSED: Final = Code(4002, "auth_refused", "new_token")
TOKEN_EXPIRED: Final = Code(4003, "token_expired", "new_token")
ID_CHANGED: Final = Code(4004, "id_changed", "now")
KICKED: Final = Code(4005, "kicked", "new_token")
DISCONNECT_MESSAGE: Final = Code(4006, "disconnect_message", "backoff")
SLOW: Final = Code(4008, "slow", "backoff")
TOO_MANY_SOCKETS: Final = Code(4009, "too_many_sockets", "backoff")
TOO_MANY_REQUESTS: Final = Code(4011, "too_many_requests", "backoff")
SHUTDOWN: Final = Code(4012, "shutdown", "now")
UNKNOWN_VERSION: Final = Code(4020, "unknown_version", "never")
BAD_NAMESPACE: Final = Code(4021, "bad_namespace", "never")
BAD_PROTOCOL: Final = Code(4022, "bad_protocol", "never")
REFRESH_REQUIRED: Final = Code(4100, "refresh_required", "new_token")
