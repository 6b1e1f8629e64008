"""The client protocols' endpoints as the configuration knows them: ``outbound.{name}_path`` and
its default, declared by each protocol as it registers
(:func:`bow_gateway.outbound.registry.register`), so that the configuration takes the
key of a protocol it never imports."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

_NAME: Final = re.compile(r"[a-z][a-z0-9]{0,31}")
_PATHS: dict[str, str | None] = {}


def declare(name: str, default_path: str | None) -> None:
    """Let the configuration take ``outbound.{name}_path`` (``None`` or ``""``: no endpoint)."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"protocol name {name!r}: lowercase letters and digits, a letter first")
    if name in _PATHS:
        raise ValueError(f"protocol {name!r} is declared already")
    _PATHS[name] = default_path


def forget(name: str) -> None:
    """The configuration takes ``outbound.{name}_path`` no more."""
    del _PATHS[name]


def declared() -> Mapping[str, str | None]:
    """Each declared protocol's name and default path, in the order they were declared."""
    return _PATHS
