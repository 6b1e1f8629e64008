"""Enrichers (contract section 15, ToyMB's enrichment API): functions that change, or refuse, the
messages whose names match an MQTT topic filter, after they are accepted and before they are
positioned.

``Bow.enricher(filter="orders/#", enrich=fn, init=setup)`` registers one. Each distinct ``init``
runs once at ``start()``, before the gateway serves. Then every message whose name matches passes
through ``fn``, the enrichers in registration order, each seeing the message as the ones before
left it (its name included): ``fn`` receives a new mapping ``{"name", "payload", "audience"}``
(``payload`` only when the message has one, as an inbound returns it) and returns the message to
accept instead, checked again as an inbound's is. Raising, or returning something that is not a
valid message, refuses it (:class:`EnricherRefused`: ``422`` at the inbound); not answering within
the timeout (``inbound.timeout``, shared by all the enrichers a request's messages pass through)
makes the gateway unable to take it now (:class:`EnricherTimeout`: ``503``).
:meth:`Enrichers.enrich` is what any source of messages calls (the inbounds, client publishes).

The topic filter parser and matcher here are minimal and private (:func:`_parse_filter`,
:func:`_matches`): MQTT 3.1.1's ``+`` (one level) and ``#`` (the last level: the rest, the parent
level included), levels split on ``/``, and a filter starting with a wildcard never matching a name
starting with ``$``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .message import Message, validate_message
from .plugins import Enrich, EnrichInit


class EnricherRefused(ValueError):
    """An enricher raised, or returned something that is not a valid message: the message (the
    ``index``-th of those given) is refused."""

    def __init__(self, enricher: str, index: int, reason: str) -> None:
        super().__init__(f"the enricher {enricher} refused the message: {reason}")
        self.enricher = enricher
        self.index = index
        self.reason = reason


class EnricherTimeout(TimeoutError):
    """An enricher did not answer in time: the gateway cannot take the message now."""

    def __init__(self, enricher: str, index: int, timeout: float) -> None:
        super().__init__(f"the enricher {enricher} did not answer within {timeout:g} s")
        self.enricher = enricher
        self.index = index


class EnricherInitError(RuntimeError):
    """An enricher's ``init`` raised at ``start()``: the gateway does not start."""


@dataclass(frozen=True, slots=True)
class _Enricher:
    name: str  # "module:function", for refusals and logs
    filter: str
    levels: tuple[str, ...]
    enrich: Enrich
    init: EnrichInit | None


class Enrichers:
    """The enrichers of one gateway, in registration order, and the pipeline they make."""

    def __init__(
        self, *, timeout: float = 5.0, max_queries: int = 1_000, max_predicates: int = 32
    ) -> None:
        self._timeout = timeout
        self._max_queries = max_queries
        self._max_predicates = max_predicates
        self._enrichers: list[_Enricher] = []

    def add(self, filter: str, enrich: Enrich, init: EnrichInit | None = None) -> None:
        """Register one; ``ValueError`` names the bad argument (a malformed filter...)."""
        levels = _parse_filter(filter)
        if not callable(enrich):
            raise ValueError(f"enrich must be callable, not {type(enrich).__name__}")
        if init is not None and not callable(init):
            raise ValueError(f"init must be callable or None, not {type(init).__name__}")
        self._enrichers.append(_Enricher(describe(enrich), filter, levels, enrich, init))

    def __bool__(self) -> bool:
        return bool(self._enrichers)

    def functions(self) -> list[Enrich]:
        """The enrich functions (``Bow.stop()`` closes those with ``aclose()``)."""
        return [enricher.enrich for enricher in self._enrichers]

    async def start(self) -> None:
        """Run each distinct ``init`` once, in registration order; the first that raises stops
        this with :class:`EnricherInitError` (its error the cause)."""
        done: list[EnrichInit] = []
        for enricher in self._enrichers:
            init = enricher.init
            if init is None or any(init is other for other in done):
                continue
            done.append(init)
            try:
                result = init()
                if inspect.isawaitable(result):
                    await result
            except Exception as error:
                raise EnricherInitError(
                    f"the init {describe(init)} of the enricher {enricher.name} (filter "
                    f"{enricher.filter!r}) raised {type(error).__name__}: {error}"
                ) from error

    async def enrich(self, message: Message) -> Message:
        """``message`` through every enricher whose filter matches its name, in order: the
        message to position, :class:`EnricherRefused` or :class:`EnricherTimeout`."""
        return (await self.enrich_all([message]))[0]

    async def enrich_all(self, messages: list[Message]) -> list[Message]:
        """:meth:`enrich` for each of ``messages`` in turn, all within one timeout; the first
        refusal or timeout stops it (its ``index`` says which message)."""
        if not self._enrichers:
            return messages
        current: tuple[_Enricher, int] | None = None
        enriched: list[Message] = []
        try:
            async with asyncio.timeout(self._timeout):
                for index, message in enumerate(messages):
                    for enricher in self._enrichers:
                        if _matches(enricher.levels, message.name):
                            current = (enricher, index)
                            message = await self._apply(enricher, index, message)
                    enriched.append(message)
        except TimeoutError:
            if current is None:  # not an enricher's: cannot be, but never hide one
                raise
            raise EnricherTimeout(current[0].name, current[1], self._timeout) from None
        return enriched

    async def _apply(self, enricher: _Enricher, index: int, message: Message) -> Message:
        document: dict[str, Any] = {"name": message.name, "audience": message.audience}
        if message.has_payload:
            document["payload"] = message.payload
        try:
            result = enricher.enrich(document)
            if inspect.isawaitable(result):
                result = await result
        except Exception as error:  # noqa: BLE001 - the user's function refused the message
            raise EnricherRefused(
                enricher.name, index, str(error) or type(error).__name__
            ) from None
        if result is None:
            reason = "it returned None, not the message (return the mapping, changed or not)"
            raise EnricherRefused(enricher.name, index, reason)
        try:
            return validate_message(
                result, max_queries=self._max_queries, max_predicates=self._max_predicates
            )
        except ValueError as error:
            raise EnricherRefused(
                enricher.name, index, f"it returned an invalid message: {error}"
            ) from None


def describe(function: Callable[..., Any]) -> str:
    """``"module:qualified.name"`` of a function (of its class, for a callable object)."""
    target: Any = function if hasattr(function, "__qualname__") else type(function)
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    return f"{module}:{name}" if module and name else repr(function)


# -- MQTT 3.1.1 topic filters, minimal (bow_gateway.topics replaces these at merge) -------------


def _parse_filter(filter: Any) -> tuple[str, ...]:
    """The levels of a topic filter; ``ValueError`` for a malformed one."""
    if not isinstance(filter, str) or not filter:
        raise ValueError(
            f"filter must be a non-empty string (an MQTT topic filter), not {filter!r}"
        )
    if "\0" in filter:
        raise ValueError(f"filter {filter!r} is malformed: it holds a NUL character")
    levels = tuple(filter.split("/"))
    for number, level in enumerate(levels):
        if "#" in level and (level != "#" or number != len(levels) - 1):
            raise ValueError(
                f"filter {filter!r} is malformed: '#' must be a whole level, and the last one"
            )
        if "+" in level and level != "+":
            raise ValueError(f"filter {filter!r} is malformed: '+' must be a whole level")
    return levels


def _matches(levels: tuple[str, ...], name: str) -> bool:
    """Whether a name matches the filter of ``levels``."""
    if name.startswith("$") and levels[0] in ("+", "#"):
        return False
    parts = name.split("/")
    for number, level in enumerate(levels):
        if level == "#":
            return True
        if number >= len(parts) or (level != "+" and level != parts[number]):
            return False
    return len(parts) == len(levels)
