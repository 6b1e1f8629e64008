"""Idempotent publish (contract section 16): a publisher's ``Idempotency-Key`` makes a repeat of
the same request harmless, within ``inbound.idempotency_window`` of its acceptance, on every
instance. The key is claimed with the messages' append to the backplane, atomically
(:class:`~bow_gateway.backplanes.Claim`): a request answered ``503`` (or lost to a timeout) and
sent again yields one delivery, whether or not the first reached Redis. A repeat with the same
body is answered the first ``204``; with another body, ``422``; while the first is under way on
this instance, ``409`` with ``Retry-After`` (the IETF ``Idempotency-Key`` draft's answers)."""

from __future__ import annotations

import hashlib
import re
from typing import Final

from aiohttp import hdrs, web

from ..backplanes import AlreadyAccepted, Claim
from .accepted import Accepted, unprocessable

KEY_HEADER: Final = "Idempotency-Key"
_KEY: Final = re.compile(r"[A-Za-z0-9._:-]{1,200}")
KEY_RULE: Final = "1 to 200 characters of A-Z a-z 0-9 . _ : -"


def checked_key(value: str | None) -> str | None:
    """The request's ``Idempotency-Key`` (None without one); ``422`` for a malformed one."""
    if value is None or _KEY.fullmatch(value):
        return value
    raise unprocessable(f"{KEY_HEADER} must be {KEY_RULE}")


class Keys:
    """One inbound path's idempotency keys: those under way on this instance, and the claims
    its requests carry (scoped to the path: the same key on two paths is two keys)."""

    __slots__ = ("_busy", "_scope", "_window")

    def __init__(self, path: str, *, window: float = 600.0) -> None:
        # The path's hash: a claim's key is it and the key itself (whose characters are safe)
        self._scope = hashlib.blake2b(path.encode(), digest_size=10).hexdigest() + ":"
        self._window = window
        self._busy: set[str] = set()

    def start(self, key: str) -> None:
        """A request with ``key`` is under way (until :meth:`end`): ``409`` for another."""
        if key in self._busy:
            raise web.HTTPConflict(
                text=f"409: a request with this {KEY_HEADER} is under way: retry later",
                headers={hdrs.RETRY_AFTER: "1"},
            )
        self._busy.add(key)

    def end(self, key: str) -> None:
        self._busy.discard(key)

    def claim(self, key: str, body: bytes, ids: list[str], batch: bool) -> Claim:
        """The claim a request with ``key`` and ``body`` publishes with; what a repeat is
        answered: the messages' ids."""
        fingerprint = hashlib.blake2b(body, digest_size=16).hexdigest()
        answer = ("b" if batch else "1") + ",".join(ids)
        return Claim(self._scope + key, fingerprint, self._window, answer)


def repeated(taken: AlreadyAccepted, claim: Claim) -> Accepted:
    """The first ``204`` of a repeat with the same body; ``422`` for another body."""
    if taken.fingerprint != claim.fingerprint:
        raise unprocessable(
            f"this {KEY_HEADER} was used for a request with another body within "
            "inbound.idempotency_window: use a new key for a new request"
        )
    kind, ids = taken.answer[:1], taken.answer[1:].split(",")
    return Accepted(taken.position, ids, kind == "b")
