"""The criteria index against a brute-force reference matcher, and its bookkeeping."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bow_gateway.core.criteria import validate_criteria
from bow_gateway.core.index import CriteriaIndex

# Few keys and values, so that random audiences often match something.
keys = st.sampled_from(["role", "blogId", "admin", "tag", "__id"])
scalars = st.one_of(
    st.booleans(),
    st.sampled_from([0, 1, 42, 418, -3]),
    st.sampled_from([1.0, 42.0, 0.5]),
    st.sampled_from(["1", "42", "author", "admin", "true"]),
)
criterion = st.one_of(scalars, st.lists(scalars, max_size=4))
criteria_maps = st.dictionaries(keys.filter(lambda k: k != "__id"), criterion, max_size=4)
listener_ids = st.one_of(st.sampled_from([1, 2, 3, 42]), st.sampled_from(["1", "2", "USER/1"]))
queries = st.dictionaries(keys, scalars, min_size=1, max_size=3)
audiences = st.lists(queries, max_size=4)


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: booleans are not numbers, numbers are not strings, 42 == 42.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    return bool(a == b)


def reference_match(criteria: dict[str, Any], audience: list[dict[str, Any]]) -> bool:
    """The contract's matching rule, written as plainly as possible."""

    def predicate(key: str, value: Any) -> bool:
        if key not in criteria:
            return False
        held = criteria[key]
        items = held if isinstance(held, list) else [held]
        return any(json_equal(item, value) for item in items)

    return any(all(predicate(k, v) for k, v in query.items()) for query in audience)


@settings(max_examples=400, deadline=None)
@given(
    listeners=st.lists(st.tuples(listener_ids, criteria_maps), max_size=12),
    audience=audiences,
)
def test_resolve_matches_the_brute_force_reference(
    listeners: list[tuple[Any, dict[str, Any]]], audience: list[dict[str, Any]]
) -> None:
    index: CriteriaIndex[int] = CriteriaIndex()
    latest: dict[Any, dict[str, Any]] = {}
    owner: dict[int, Any] = {}
    for socket, (listener_id, raw) in enumerate(listeners):
        criteria = validate_criteria(raw, listener_id)
        index.add(socket, listener_id, criteria)
        latest[listener_id] = criteria  # criteria belong to the id: the last one wins
        owner[socket] = listener_id
    expected = {s for s, lid in owner.items() if reference_match(latest[lid], audience)}
    assert index.resolve(audience) == expected


@settings(max_examples=200, deadline=None)
@given(
    listeners=st.lists(st.tuples(listener_ids, criteria_maps), max_size=10),
    removed=st.sets(st.integers(0, 9)),
    audience=audiences,
)
def test_resolve_after_removals_matches_the_reference(
    listeners: list[tuple[Any, dict[str, Any]]], removed: set[int], audience: list[dict[str, Any]]
) -> None:
    index: CriteriaIndex[int] = CriteriaIndex()
    latest: dict[Any, dict[str, Any]] = {}
    owner: dict[int, Any] = {}
    for socket, (listener_id, raw) in enumerate(listeners):
        criteria = validate_criteria(raw, listener_id)
        index.add(socket, listener_id, criteria)
        latest[listener_id] = criteria
        owner[socket] = listener_id
    for socket in removed & set(owner):
        index.remove(socket, owner.pop(socket))
    expected = {s for s, lid in owner.items() if reference_match(latest[lid], audience)}
    assert index.resolve(audience) == expected


def test_true_does_not_match_one_nor_one_true() -> None:
    index: CriteriaIndex[str] = CriteriaIndex()
    index.add("a", "A", validate_criteria({"flag": True}, "A"))
    index.add("b", "B", validate_criteria({"flag": 1}, "B"))
    assert index.resolve([{"flag": True}]) == {"a"}
    assert index.resolve([{"flag": 1}]) == {"b"}
    assert index.resolve([{"flag": 1.0}]) == {"b"}


def test_string_42_does_not_match_number_42() -> None:
    index: CriteriaIndex[str] = CriteriaIndex()
    index.add("s", "S", validate_criteria({"blogId": "42"}, "S"))
    index.add("n", "N", validate_criteria({"blogId": [42, 418]}, "N"))
    assert index.resolve([{"blogId": 42}]) == {"n"}
    assert index.resolve([{"blogId": 42.0}]) == {"n"}
    assert index.resolve([{"blogId": "42"}]) == {"s"}


def test_id_query_reaches_every_socket_of_the_listener() -> None:
    index: CriteriaIndex[str] = CriteriaIndex()
    index.add("browser", 7, validate_criteria({"role": "admin"}, 7))
    index.add("phone", 7, validate_criteria({"role": "admin"}, 7))
    index.add("other", "7", validate_criteria({"role": "admin"}, "7"))
    assert index.resolve([{"__id": 7}]) == {"browser", "phone"}
    assert index.resolve([{"__id": 7.0, "role": "admin"}]) == {"browser", "phone"}
    assert index.resolve([{"__id": 7, "role": "author"}]) == set()
    assert index.resolve([{"__id": True}]) == set()


def test_update_is_strict_and_reindexes_every_socket_of_the_id() -> None:
    index: CriteriaIndex[str] = CriteriaIndex()
    index.add("a", 1, validate_criteria({"v": 1}, 1))
    index.add("b", 1, validate_criteria({"v": 1}, 1))
    assert index.update(1, validate_criteria({"v": 1.0}, 1)) is False
    assert index.update(1, validate_criteria({"v": "1"}, 1)) is True
    assert index.resolve([{"v": 1}]) == set()
    assert index.resolve([{"v": "1"}]) == {"a", "b"}


def test_update_of_an_unknown_listener_does_not_create_it() -> None:
    index: CriteriaIndex[str] = CriteriaIndex()
    assert index.update("nobody", validate_criteria({"role": "admin"}, "nobody")) is False
    assert len(index) == 0
    assert index.resolve([{"role": "admin"}]) == set()


def test_last_socket_removed_forgets_the_listener_and_its_postings() -> None:
    index: CriteriaIndex[str] = CriteriaIndex()
    index.add("a", 1, validate_criteria({"role": "admin", "tags": ["x", "y"]}, 1))
    index.add("b", 1, validate_criteria({"role": "admin", "tags": ["x", "y"]}, 1))
    index.remove("a", 1)
    assert index.resolve([{"role": "admin"}]) == {"b"}
    index.remove("b", 1)
    assert len(index) == 0
    assert index._postings == {}


def test_empty_audience_reaches_nobody() -> None:
    index: CriteriaIndex[str] = CriteriaIndex()
    index.add("a", 1, validate_criteria({"role": "admin"}, 1))
    assert index.resolve([]) == set()
