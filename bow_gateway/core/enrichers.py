"""Enrichers (contract section 15, ToyMB's enrichment API): functions that change, or refuse, the
messages whose names match an MQTT topic filter, after they are accepted and before they are
positioned.

``Bow.enricher(filter="orders/#", enrich=fn, init=setup)`` registers one. Each distinct ``init``
runs once at ``start()``, before the gateway serves. Then every message whose name matches passes
through ``fn``, the enrichers in registration order, each seeing the message as the ones before
left it (its name included): ``fn`` receives a new mapping ``{"name", "payload", "audience"}``
(``payload`` only when the message has one, as an inbound returns it; ``headers``, ``user_id``,
``application_id``, ``message_id`` when set) and returns the message to accept instead, checked
again as an inbound's is. Raising, or returning something that is not a valid message, refuses it
(:class:`EnricherRefused`: ``422`` at the inbound); not answering within the timeout
(``inbound.timeout``, shared by all the enrichers a request's messages pass through) makes the
gateway unable to take it now (:class:`EnricherTimeout`: ``503``).
:meth:`Enrichers.enrich` is what any source of messages calls (the inbounds, client publishes).

Filters are MQTT 3.1.1's, parsed and matched by :mod:`.topics` (which also lets an enricher name
the gateway's ``$`` topics).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .message import Message, validate_message
from .plugins import Enrich, EnrichInit
from .publication import as_mapping
from .topics import filter_matches, parse_filter


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
        levels = _parse(filter)
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
                        if filter_matches(enricher.levels, message.name):
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
        if message.publication is not None:
            document.update(as_mapping(message.publication))
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


def _parse(filter: Any) -> tuple[str, ...]:
    """An enricher's filter, as :mod:`.topics` parses them (``$`` topics allowed)."""
    try:
        return parse_filter(filter, system=True)
    except ValueError as error:
        raise ValueError(f"filter: {error}") from None
