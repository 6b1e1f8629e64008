"""A request's ``Bow-Receipt`` and ``Bow-Fallback`` headers (contract sections 17 and 19)."""

from __future__ import annotations

from typing import Final, NamedTuple

from .accepted import unprocessable

RECEIPT_HEADER: Final = "Bow-Receipt"
FALLBACK_HEADER: Final = "Bow-Fallback"
MAX_WINDOW: Final = 3_600
"""Seconds a receipt may stay open, at most."""


class Asked(NamedTuple):
    """What a request asked of its messages: a receipt open ``window`` seconds (0: none), and
    ``message.undelivered`` for those who missed one (``fallback``)."""

    window: int = 0
    fallback: bool = False


NOTHING: Final = Asked()


def checked_receipt(receipt: str | None, fallback: str | None) -> Asked:
    """The request's ``Bow-Receipt`` and ``Bow-Fallback`` (whole seconds, 1-3600; ``422`` for
    anything else, or for both with different values)."""
    if receipt is None and fallback is None:
        return NOTHING
    window = _seconds(RECEIPT_HEADER, receipt) if receipt is not None else 0
    if fallback is None:
        return Asked(window)
    seconds = _seconds(FALLBACK_HEADER, fallback)
    if window and window != seconds:
        raise unprocessable(
            f"{FALLBACK_HEADER} implies {RECEIPT_HEADER} with the same seconds: "
            f"{seconds} and {window} differ"
        )
    return Asked(seconds, True)


def _seconds(header: str, value: str) -> int:
    text = value.strip()
    if text.isdigit() and len(text) <= 4 and 1 <= int(text) <= MAX_WINDOW:
        return int(text)
    raise unprocessable(f"{header} must be whole seconds from 1 to {MAX_WINDOW}, not {value!r}")
