"""What the ``bow-gateway`` commands share: the defaults and examples they print, the usage error,
and stopping on a signal."""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Final

from ..app.standalone_defaults import DEFAULT_PORT

DEFAULT_URL: Final = f"http://127.0.0.1:{DEFAULT_PORT}"
PASSWORD_ENV: Final = "BOW_INBOUND_PASSWORD"
EXAMPLE_ID: Final = "USER/1"
EXAMPLE_CRITERIA: Final = '{"role": "admin"}'
EXAMPLE_AUDIENCE: Final = '[{"role": "admin"}]'
EXAMPLE_PAYLOAD: Final = '{"text": "hello"}'
MISSING_PART: Final = 3
"""The exit status when an extra's package is missing (2 is a bad argument or configuration)."""


class UsageError(Exception):
    """A bad argument: reported on stderr, exit status 2."""


class StdoutClosed(Exception):
    """stdout's reader went away (``listen | head -1``): the command stops quietly, as ``yes``
    does; not an ``OSError``, so that no network retry takes it for a lost connection."""


def counted(count: int, noun: str) -> str:
    """``1 message``, ``2 messages``: a count and its noun, in the singular or the plural."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def stop_on_signals() -> asyncio.Event:
    """An event set by the first SIGINT or SIGTERM; a second one interrupts for good."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def handle() -> None:
        stop.set()
        for number in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(number)

    for number in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(number, handle)
        except (NotImplementedError, RuntimeError):  # not on this platform or thread
            pass
    return stop


def positive_int(text: str) -> int:
    """An option's whole number, at least 1 (argparse's ``type``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text!r}")
    return value
