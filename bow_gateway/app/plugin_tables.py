"""The plugin tables of a standalone config file (``[[middlewares]]``, ``[[inbounds]]``,
``[[outbounds]]``, ``[[enrichers]]``, ``health_check``): checked, their ``module:attr``
references resolved (with ``options``, ``attr(**options)``), plugin modules found beside the file
too; used by :mod:`bow_gateway.app.standalone`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Final

from ..core.plugins import (
    EnricherPlugin,
    HealthCheck,
    InboundPlugin,
    MiddlewarePlugin,
    OutboundPlugin,
    resolve,
)

PLUGIN_KEYS: Final = ("middlewares", "inbounds", "outbounds", "enrichers", "health_check")
FUNCTION_KEYS: Final = {
    "middlewares": "create_criteria_from_listener_details",
    "inbounds": "create_message_from_request_body",
    "outbounds": "create_listener_details_from_token",
    "enrichers": "enrich",
}
REQUEST_FUNCTION: Final = "create_message_from_request"
"""An ``[[inbounds]]`` table's other function key: exactly one of the two is given."""


def read_plugins(
    document: Mapping[str, Any],
) -> tuple[
    tuple[MiddlewarePlugin, ...],
    tuple[InboundPlugin, ...],
    tuple[OutboundPlugin, ...],
    tuple[EnricherPlugin, ...],
    HealthCheck | None,
]:
    """The plugins of a config file's ``[[middlewares]]``, ``[[inbounds]]``, ``[[outbounds]]``
    and ``[[enrichers]]`` tables and its ``health_check``, resolved; a bad table is a
    ``ValueError`` naming it."""
    key = FUNCTION_KEYS["middlewares"]
    middlewares = tuple(
        MiddlewarePlugin(
            version=_string(table, "version", name),
            create_criteria_from_listener_details=_resolve(table, name, key),
            reference=table[key],
            table=name,
        )
        for name, table in _tables(document, "middlewares", {"version"})
    )
    inbounds = tuple(
        InboundPlugin(
            path=_string(table, "path", name),
            create_message_from_request_body=_resolve(table, name, body) if body else None,
            middleware_version=_string(table, "middleware_version", name),
            reference=table[body or REQUEST_FUNCTION],
            table=name,
            create_message_from_request=None if body else _resolve(table, name, REQUEST_FUNCTION),
        )
        for name, table in _tables(
            document, "inbounds", {"path", "middleware_version"}, frozenset({REQUEST_FUNCTION})
        )
        for body in [_inbound_function(table, name)]
    )
    key = FUNCTION_KEYS["outbounds"]
    outbounds = tuple(
        OutboundPlugin(
            version=_string(table, "version", name),
            create_listener_details_from_token=_resolve(table, name, key),
            middleware_version=_string(table, "middleware_version", name),
            reference=table[key],
            table=name,
            anonymous_criteria=table.get("anonymous_criteria"),
            create_message_from_publish=(
                _resolve(table, name, "create_message_from_publish", options=False)
                if "create_message_from_publish" in table
                else None
            ),
        )
        for name, table in _tables(
            document,
            "outbounds",
            {"version", "middleware_version"},
            frozenset({"anonymous_criteria", "create_message_from_publish"}),
        )
    )
    key = FUNCTION_KEYS["enrichers"]
    enrichers = tuple(
        EnricherPlugin(
            filter=_string(table, "filter", name),
            enrich=_resolve(table, name, key),
            init=_resolve(table, name, "init", options=False) if "init" in table else None,
            reference=table[key],
            table=name,
        )
        for name, table in _tables(document, "enrichers", {"filter"}, frozenset({"init"}))
    )
    health_check = None
    if document.get("health_check") is not None:
        health_check = _resolve(document, "health_check", "health_check", options=False)
    return middlewares, inbounds, outbounds, enrichers, health_check


def _inbound_function(table: Mapping[str, Any], name: str) -> str | None:
    """``create_message_from_request_body`` when an ``[[inbounds]]`` table names that function,
    ``None`` when it names ``create_message_from_request``; neither or both is a ``ValueError``."""
    body, request = FUNCTION_KEYS["inbounds"], REQUEST_FUNCTION
    if (body in table) == (request in table):
        raise ValueError(f"{name}: give exactly one of {body} and {request}")
    return body if body in table else None


def _tables(
    document: Mapping[str, Any], key: str, strings: set[str], optional: frozenset[str] = frozenset()
) -> Iterator[tuple[str, dict[str, Any]]]:
    tables = document.get(key, [])
    if not isinstance(tables, list) or not all(isinstance(t, Mapping) for t in tables):
        raise ValueError(f"{key} must be a list of tables, written [[{key}]]")
    allowed = {*strings, FUNCTION_KEYS[key], "options", *optional}
    for number, table in enumerate(tables, start=1):
        name = f"[[{key}]] #{number}"
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise ValueError(
                f"{name}: unknown key {unknown[0]!r} (expected {', '.join(sorted(allowed))})"
            )
        required = allowed - {"options", *optional}
        if key == "inbounds":  # one of its two functions: read_plugins checks
            required.discard(FUNCTION_KEYS[key])
        missing = sorted(k for k in required if k not in table)
        if missing:
            raise ValueError(f"{name}: {missing[0]} is missing")
        yield name, dict(table)


def _string(table: Mapping[str, Any], key: str, name: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}: {key} must be a non-empty string, not {value!r}")
    return value


def _resolve(table: Mapping[str, Any], name: str, key: str, *, options: bool = True) -> Any:
    """``"module:attr"`` to a function; with an ``options`` table, ``attr(**options)``."""
    reference = _string(table, key, name)
    try:
        target = resolve(reference)
    except ValueError as error:  # keeps the import's own traceback as the cause
        raise ValueError(f"{name}: {error}") from error.__cause__
    if options and "options" in table:
        arguments = table["options"]
        if not isinstance(arguments, Mapping):
            raise ValueError(f"{name}: options must be a table, not {arguments!r}")
        if not callable(target):
            raise ValueError(f"{name}: {reference!r} takes no options: it is not callable")
        try:
            target = target(**arguments)
        except Exception as error:  # the factory's own refusal, reported as such
            raise ValueError(
                f"{name}: {reference}(**options) failed: {type(error).__name__}: {error}"
            ) from error
    if not callable(target):
        what = f"{reference}(**options)" if options and "options" in table else reference
        raise ValueError(f"{name}: {what} is a {type(target).__name__}, not a function")
    return target


@contextlib.contextmanager
def importable(folder: str | None) -> Iterator[None]:
    """Let plugin modules be found beside the config file while the plugins are imported."""
    if folder is None or folder in sys.path:
        yield
        return
    sys.path.append(folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


@contextlib.contextmanager
def naming(table: str | None) -> Iterator[None]:
    try:
        yield
    except ValueError as error:
        raise ValueError(f"{table}: {error}" if table else str(error)) from None
