"""Message ids (contract section 16): made by the gateway, unique across instances and restarts,
never reused. A random prefix of 72 bits drawn when the process starts (again in a forked child),
then a counter: one id costs an increment and a format, not a draw from the system's random."""

from __future__ import annotations

import itertools
import os
import secrets

_prefix = ""
_counter = itertools.count(1)


def _draw() -> None:
    global _prefix, _counter
    _prefix = secrets.token_urlsafe(9)  # 12 characters of A-Z a-z 0-9 - _
    _counter = itertools.count(1)


_draw()
os.register_at_fork(after_in_child=_draw)


def new_id() -> str:
    """A new message id: 12 characters of this process's prefix, then a hexadecimal count."""
    return f"{_prefix}{next(_counter):x}"


def new_ids(count: int) -> list[str]:
    """``count`` new message ids, in order."""
    prefix, counter = _prefix, _counter
    if count == 1:  # nearly always: no comprehension's frame
        return [f"{prefix}{next(counter):x}"]
    return [f"{prefix}{next(counter):x}" for _ in range(count)]
