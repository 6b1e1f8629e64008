"""The plugin contract (bow_gateway.core.plugins): what the capability protocols recognise, what the
public API exports, and the one ``module:attribute`` resolver."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from bow_gateway.middlewares.claims import criteria_from_claim
from bow_gateway.middlewares.database import DatabaseCriteria
from bow_gateway.middlewares.precomputed import PrecomputedCriteria
from bow_gateway.outbounds.jwt import JwtOutbound

import bow_gateway
from bow_gateway.core.plugins import AsyncClosable, WatchesCriteria, resolve

from .support import SECRET


class Watching:
    """A middleware object that watches its criteria and holds a connection."""

    def __call__(self, details: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    async def watch(self) -> AsyncIterator[list[Any] | None]:
        yield None

    async def aclose(self) -> None:
        pass


def test_a_middleware_with_watch_is_recognised_as_watching_its_criteria() -> None:
    assert isinstance(Watching(), WatchesCriteria)
    assert isinstance(PrecomputedCriteria("redis://127.0.0.1:1/0"), WatchesCriteria)


def test_plain_functions_and_objects_without_watch_do_not_watch() -> None:
    assert not isinstance(criteria_from_claim(), WatchesCriteria)
    assert not isinstance(DatabaseCriteria(query="SELECT 1"), WatchesCriteria)
    assert not isinstance(JwtOutbound(secret=SECRET), WatchesCriteria)


def test_plugins_holding_connections_are_recognised_as_closable() -> None:
    assert isinstance(Watching(), AsyncClosable)
    assert isinstance(DatabaseCriteria(query="SELECT 1"), AsyncClosable)
    assert isinstance(PrecomputedCriteria("redis://127.0.0.1:1/0"), AsyncClosable)
    assert not isinstance(criteria_from_claim(), AsyncClosable)


def test_the_public_api_exports_the_contract() -> None:
    for name in (
        "Bow",
        "CreateMessageFromRequestBody",
        "CreateMessageFromRequest",
        "InboundRequest",
        "CreateListenerDetailsFromToken",
        "CreateCriteriaFromListenerDetails",
        "HealthCheck",
        "Enrich",
        "WatchesCriteria",
        "AsyncClosable",
    ):
        assert name in bow_gateway.__all__ and hasattr(bow_gateway, name), name


def test_a_reference_names_a_module_s_attribute_even_a_dotted_one() -> None:
    assert resolve("bow_gateway.middlewares.claims:criteria_from_claim") is criteria_from_claim
    assert resolve("tests.test_plugins:Watching.aclose") is Watching.aclose


@pytest.mark.parametrize(
    ("reference", "error"),
    [
        ("bow_gateway.middlewares.claims", r"'bow_gateway.middlewares.claims' must look like"),
        (":criteria_from_claim", r"must look like 'module:attribute'"),
        ("no_such_module_here:f", r"cannot import 'no_such_module_here:f': ModuleNotFoundError"),
        ("tests.test_plugins:Missing", r"tests.test_plugins has no attribute 'Missing'"),
    ],
    ids=["no-attribute", "no-module", "unknown-module", "unknown-attribute"],
)
def test_a_bad_reference_is_a_value_error_quoting_it(reference: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        resolve(reference)


def test_an_import_that_fails_keeps_its_error_as_the_cause() -> None:
    with pytest.raises(ValueError) as raised:
        resolve("no_such_module_here:f")
    assert isinstance(raised.value.__cause__, ModuleNotFoundError)
