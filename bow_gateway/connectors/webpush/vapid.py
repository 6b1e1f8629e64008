"""VAPID (RFC 8292): the ``Authorization: vapid t=<JWT>, k=<public key>`` header that tells a push
service who sends, an ES256 token per push service origin, signed with the configured key and
reused until an hour before it expires."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Final

import jwt

from ...core.webpush_settings import WebPushSettings

LIFETIME: Final = 12 * 3_600
"""Seconds a token is valid (RFC 8292: at most 24 h)."""
RENEW_BEFORE: Final = 3_600
"""Seconds before its expiry a token is signed again."""


class Vapid:
    """The header for each push service origin, at most ``max_origins`` tokens kept."""

    def __init__(self, settings: WebPushSettings, *, max_origins: int = 1_000) -> None:
        self._key = settings.private_key
        self._subject = settings.subject
        self._public = settings.public_key
        self._max_origins = max_origins
        self._tokens: OrderedDict[str, tuple[str, float]] = OrderedDict()  # origin: header, exp

    def header(self, origin: str) -> str:
        """``vapid t=..., k=...`` for a push service at ``origin`` (its scheme, host and port)."""
        now = time.time()
        cached = self._tokens.get(origin)
        if cached is not None and cached[1] - RENEW_BEFORE > now:
            return cached[0]
        expires = int(now) + LIFETIME
        claims = {"aud": origin, "exp": expires, "sub": self._subject}
        token = jwt.encode(claims, self._key, algorithm="ES256")
        value = f"vapid t={token}, k={self._public}"
        self._tokens[origin] = (value, expires)
        self._tokens.move_to_end(origin)
        while len(self._tokens) > self._max_origins:
            self._tokens.popitem(last=False)
        return value
