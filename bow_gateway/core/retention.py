"""Which messages are kept in their topic's history (``clients.md`` section 14): the
``history`` setting, a list of MQTT filters each with a ``max_count`` and a ``max_age``.

A message whose name matches a filter (the first that does) is kept under its name, its topic,
with a sequence distinct and increasing within the topic (:mod:`bow_gateway.backplanes`): a
:class:`Retention` goes with the message to the backplane. The answer for each name is
remembered: names repeat.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .topics import filter_matches, parse_filter

MAX_REMEMBERED: Final = 10_000  # names whose answer is remembered (then forgotten at once)


@dataclass(frozen=True, slots=True)
class Retention:
    """Keep an event in its topic's history too (``clients.md`` section 14): at most
    ``max_count`` events of the topic, none older than ``max_age`` seconds."""

    topic: str
    max_count: int
    max_age: float


@dataclass(frozen=True)
class HistoryRule:
    """One ``[[history]]`` table: the names it keeps, how many of each topic, for how long."""

    filter: str
    max_count: int = 10_000
    max_age: float = 86_400.0


class Retentions:
    """The history rules, asked once per name: :meth:`of` is the :class:`Retention` of a name."""

    def __init__(self, rules: Sequence[HistoryRule] = ()) -> None:
        self._rules = [(parse_filter(rule.filter, system=True), rule) for rule in rules]
        self._answers: dict[str, Retention | None] = {}

    def __bool__(self) -> bool:
        return bool(self._rules)

    def of(self, name: str) -> Retention | None:
        """How ``name`` is kept, or None when no rule keeps it."""
        try:
            return self._answers[name]
        except KeyError:
            pass
        answer = next(
            (
                Retention(name, rule.max_count, rule.max_age)
                for levels, rule in self._rules
                if filter_matches(levels, name)
            ),
            None,
        )
        if len(self._answers) >= MAX_REMEMBERED:
            self._answers.clear()
        self._answers[name] = answer
        return answer

    def rule_for(self, topic: str) -> HistoryRule | None:
        """The rule keeping ``topic``, for readers (its ``max_age`` bounds what is replayed)."""
        return next((rule for levels, rule in self._rules if filter_matches(levels, topic)), None)


def history_rules(tables: Any) -> list[HistoryRule]:
    """The ``history`` setting: ``ValueError`` names the bad table and field."""
    if tables is None:
        return []
    if isinstance(tables, str):  # BOW_HISTORY: the list as JSON
        try:
            tables = json.loads(tables)
        except ValueError as error:
            raise ValueError(f"history: not a JSON list of tables: {error}") from None
    if not isinstance(tables, Sequence) or isinstance(tables, (str, bytes)):
        raise ValueError("history must be a list of tables ([[history]])")
    rules = []
    for index, table in enumerate(tables):
        where = f"history.{index}"
        if not isinstance(table, Mapping):
            raise ValueError(f"{where}: a table with filter, max_count, max_age")
        unknown = sorted(set(table) - {"filter", "max_count", "max_age"})
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r}")
        try:
            parse_filter(table.get("filter"), system=True)
        except ValueError as error:
            raise ValueError(f"{where}.filter: {error}") from None
        max_count = table.get("max_count", 10_000)
        if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1:
            raise ValueError(f"{where}.max_count: a positive integer, not {max_count!r}")
        max_age = table.get("max_age", 86_400.0)
        if isinstance(max_age, bool) or not isinstance(max_age, (int, float)) or max_age <= 0:
            raise ValueError(f"{where}.max_age: positive seconds, not {max_age!r}")
        rules.append(HistoryRule(table["filter"], max_count, float(max_age)))
    return rules
