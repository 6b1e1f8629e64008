"""Calling the user's functions: plain or coroutine, bounded in time, never trusted."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from ..core.plugins import PluginFunction


async def call_user_function(function: PluginFunction, argument: Any, timeout: float) -> Any:
    """Call ``function(argument)`` and await what it returns if it is awaitable.

    A coroutine that has not answered within ``timeout`` seconds is cancelled (``TimeoutError``).
    A plain function runs on the event loop, as in Bow: it must not block.
    """
    result = function(argument)
    if type(result) is dict:  # what a plain function returns, nearly always: nothing to await
        return result
    if inspect.isawaitable(result):
        async with asyncio.timeout(timeout):
            result = await result
    return result


def describe(function: Callable[..., Any]) -> str:
    """A readable name for a user function, for error messages."""
    return getattr(function, "__qualname__", None) or repr(function)
