"""Criteria and listener details: what a listener is, checked with marshmallow.

Values are JSON scalars. Python says ``True == 1`` and ``hash(True) == hash(1)``, JSON does not, so
every value that goes into the index is turned into a *typed key* first: booleans become sentinels
that equal nothing else, numbers and strings stay as they are (``42 == 42.0`` holds in both worlds).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterator, Mapping
from typing import Any, Final

from marshmallow import Schema, ValidationError, fields

Scalar = bool | int | float | str
Criteria = dict[str, Scalar | list[Scalar]]
ListenerId = int | float | str

ID_KEY: Final = "__id"

TRUE: Final = ("json", True)
FALSE: Final = ("json", False)

SCALAR_ERROR: Final = "must be true, false, a number or a non-empty string"


def typed_key(value: Scalar) -> Hashable:
    """The index key of a JSON scalar: ``true`` never meets ``1``, ``42`` meets ``42.0``."""
    if value is True:
        return TRUE
    if value is False:
        return FALSE
    return value


def is_scalar(value: object) -> bool:
    """True for the values a predicate or a criterion may hold."""
    if isinstance(value, bool):
        return True
    if isinstance(value, (int, float)):
        return not isinstance(value, float) or math.isfinite(value)
    return isinstance(value, str) and value != ""


def is_listener_id(value: object) -> bool:
    """True for a listener id: a finite number (not a boolean) or a non-empty string."""
    return is_scalar(value) and not isinstance(value, bool)


class ScalarField(fields.Field):  # type: ignore[type-arg]
    """A JSON scalar as Bow defines it: a boolean, a finite number or a non-empty string."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Scalar:
        if not is_scalar(value):
            raise ValidationError(SCALAR_ERROR)
        return value  # type: ignore[no-any-return]


class CriterionField(fields.Field):  # type: ignore[type-arg]
    """A criterion value: a scalar, or a list of scalars."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if isinstance(value, list):
            for position, item in enumerate(value):
                if not is_scalar(item):
                    raise ValidationError(f"item {position} {SCALAR_ERROR}")
            return value
        if not is_scalar(value):
            raise ValidationError(f"{SCALAR_ERROR}, or a list of those")
        return value


class ListenerIdField(fields.Field):  # type: ignore[type-arg]
    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> ListenerId:
        if not is_listener_id(value):
            raise ValidationError("must be a number or a non-empty string")
        return value  # type: ignore[no-any-return]


class _CriteriaSchema(Schema):
    criteria = fields.Dict(keys=fields.String(), values=CriterionField(), required=True)


class _ListenerDetailsSchema(Schema):
    id = ListenerIdField(required=True)


_criteria_schema: Final = _CriteriaSchema()
_listener_details_schema: Final = _ListenerDetailsSchema()  # one: a schema is a reference cycle


def error_text(messages: Any, prefix: str = "", *, limit: int = 10, width: int = 200) -> str:
    """Flatten marshmallow's nested error messages into one line that names each field.

    Only the first ``limit`` errors, each cut at ``width`` characters, then how many more: a
    document with thousands of faults (or a key a megabyte long) still gets a short answer.
    """
    parts = _error_parts(messages, prefix)
    shown = [_cut(part, width) for part in itertools.islice(parts, limit)]
    rest = sum(1 for _ in parts)
    text = "; ".join(shown)
    return f"{text}; and {rest} more" if rest else text


def _error_parts(messages: Any, prefix: str) -> Iterator[str]:
    if isinstance(messages, Mapping):
        for field, inner in messages.items():
            name = _cut(str(field), 60) if field != "_schema" else ""
            # marshmallow's Dict field reports value errors under {"key": {"value": [...]}}
            if isinstance(inner, Mapping) and set(inner) <= {"key", "value"}:
                inner = [*inner.get("key", []), *_flat(inner.get("value", []))]
            path = f"{prefix}.{name}" if prefix and name else prefix or name
            yield from _error_parts(inner, path)
    elif isinstance(messages, list):
        yield from (f"{prefix}: {m}" if prefix else m for m in _flat(messages))
    else:
        yield f"{prefix}: {messages}" if prefix else str(messages)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width] + "..."


def _flat(messages: Any) -> list[str]:
    if isinstance(messages, list):
        return [str(m) for m in messages]
    return [str(messages)]


def validate_criteria(criteria: Any, listener_id: ListenerId) -> Criteria:
    """Check what a middleware returned and add ``__id``; raise ``ValueError`` naming the field."""
    if not isinstance(criteria, Mapping):
        raise ValueError(f"criteria must be a mapping, not {type(criteria).__name__}")
    if ID_KEY in criteria:
        raise ValueError(f"criteria must not set {ID_KEY}: the gateway sets it to the listener id")
    try:
        checked: Criteria = _criteria_schema.load({"criteria": dict(criteria)})["criteria"]
    except ValidationError as error:
        raise ValueError(error_text(error.messages)) from None
    checked[ID_KEY] = listener_id
    return checked


def validate_listener_details(details: Any) -> Mapping[str, Any]:
    """Check what an outbound returned: a mapping whose ``id`` is a number or a non-empty string."""
    if not isinstance(details, Mapping):
        raise ValueError(f"listener details must be a mapping, not {type(details).__name__}")
    errors = _listener_details_schema.validate({"id": details.get("id")} if "id" in details else {})
    if errors:
        raise ValueError("listener details: " + error_text(errors))
    return details


def criteria_entries(
    criteria: Mapping[str, Scalar | list[Scalar]],
) -> frozenset[tuple[str, Hashable]]:
    """Every (key, typed value) pair a listener can be matched on; lists give one pair per item."""
    entries: list[tuple[str, Hashable]] = []
    for key, value in criteria.items():
        if isinstance(value, list):
            entries.extend((key, typed_key(item)) for item in value)
        else:
            entries.append((key, typed_key(value)))
    return frozenset(entries)
