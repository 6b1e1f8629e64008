"""The message schema, its fast path, and the events that cross the backplane."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bow_gateway.core.message import (
    CriteriaEvent,
    Message,
    MessageEvent,
    _plainly_valid,
    _schema,
    decode_event,
    encode_event,
    parse_json,
    validate_message,
)
from bow_gateway.core.names import name_error
from bow_gateway.core.publication import Publication

scalars = st.one_of(
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.none(),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=2), max_leaves=3)
# Mostly near-valid shapes (a scalar of each kind, and the invalid ones: None, NaN, ""), so that
# the fast path accepts many of them and refuses many for one detail.
near_queries = st.dictionaries(st.text(max_size=2), scalars, max_size=3)
good_scalars = st.one_of(
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(min_size=1),
)
good_queries = st.dictionaries(st.text(max_size=2), good_scalars, min_size=1, max_size=3)
queries = st.one_of(
    good_queries,
    good_queries,
    good_queries,
    near_queries,
    st.dictionaries(st.integers(), values, max_size=1),
    st.dictionaries(st.text(max_size=2), values, max_size=2),
    values,
)
names = st.one_of(st.text(min_size=1), st.text(max_size=3), st.integers(), st.none())
audiences = st.one_of(st.lists(queries, max_size=3), queries)
extras = {"payload": values, "other": values}
documents = st.one_of(
    st.fixed_dictionaries({"name": names, "audience": audiences}, optional=extras),
    st.fixed_dictionaries({}, optional={"name": names, "audience": audiences, **extras}),
)


@settings(max_examples=2_000)
@given(documents)
def test_the_fast_path_accepts_only_what_the_schema_accepts_and_gives_the_same_message(
    document: dict[str, Any],
) -> None:
    fast = _plainly_valid(document)
    if fast is None:
        return
    loaded = _schema.load(document)  # raises if the fast path accepted too much
    assert fast == Message(
        loaded["name"], loaded["audience"], loaded.get("payload"), "payload" in loaded
    )


def test_typical_messages_take_the_fast_path() -> None:
    document = {"name": "N", "audience": [{"role": "admin", "blogId": 42}], "payload": None}
    assert _plainly_valid(document) == Message("N", document["audience"], None, True)
    assert validate_message(document) == _plainly_valid(document)


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"name": "", "audience": []}, "name"),
        ({"name": "X", "audience": [{}]}, "audience.0"),
        ({"name": "X", "audience": [{"k": float("nan")}]}, "audience.0.k"),
        ({"name": "X"}, "audience"),
    ],
)
def test_what_the_fast_path_refuses_gets_the_schema_s_words(
    document: dict[str, Any], field: str
) -> None:
    assert _plainly_valid(document) is None
    with pytest.raises(ValueError, match=f"{field}:"):
        validate_message(document)


def test_events_survive_the_backplane_encoding() -> None:
    message = Message("N", [{"__id": "USER/1"}], {"text": "é", "n": 1.5}, True)
    event = MessageEvent("v1", message, 1234.5)
    assert decode_event(encode_event(event)) == event
    criteria = CriteriaEvent("v1", 42, {"__id": 42, "role": ["a", "b"], "ok": True})
    assert decode_event(encode_event(criteria)) == criteria


def test_what_json_cannot_hold_is_a_value_error() -> None:
    event = MessageEvent("v1", Message("N", [], {1, 2}, True))
    with pytest.raises(ValueError, match="not JSON"):
        encode_event(event)
    with pytest.raises(ValueError):
        parse_json(b"NaN")


def test_repeated_queries_are_kept_once_whatever_their_key_order() -> None:
    audience = [{"role": "author", "blogId": 42}, {"blogId": 42, "role": "author"}] * 400
    message = validate_message(
        {"name": "N", "audience": [*audience, {"blogId": 42.0, "role": "author"}]}
    )
    assert message.audience == [{"role": "author", "blogId": 42}]


def test_queries_that_differ_in_json_are_all_kept() -> None:
    audience = [{"flag": 1}, {"flag": True}, {"flag": "1"}]
    assert validate_message({"name": "N", "audience": audience}).audience == audience


# -- Gobbler's fields: headers and the publisher's ids -------------------------------------------

GOBBLER = {"headers": {"Key": "Value"}, "user_id": "marvin", "message_id": "42"}


def test_headers_and_publisher_ids_become_the_message_s_publication() -> None:
    message = validate_message({"name": "/foo", "audience": [], **GOBBLER, "application_id": "a1"})
    assert message.publication == Publication({"Key": "Value"}, "marvin", "a1", "42")


def test_a_message_without_them_has_no_publication_and_encodes_without_one() -> None:
    message = validate_message({"name": "N", "audience": [], "payload": 1, "other": 2})
    assert type(message) is Message and message.publication is None
    assert b'"g"' not in encode_event(MessageEvent("v1", message))


def test_none_for_each_of_them_is_as_if_absent() -> None:
    document = {"name": "N", "audience": [], "headers": None, "user_id": None, "message_id": None}
    assert validate_message(document).publication is None


def test_the_publication_survives_the_backplane_encoding() -> None:
    message = validate_message({"name": "/foo", "audience": [], "payload": "Hello", **GOBBLER})
    event = MessageEvent("v1", message, 1234.5)
    assert decode_event(encode_event(event)) == event


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"headers": ["Key"]}, "headers: must be a mapping"),
        ({"headers": {f"H{n}": "v" for n in range(65)}}, "headers: at most 64 headers, not 65"),
        ({"headers": {"Key": "x" * 8_190}}, "headers: at most 8192 bytes of names and values"),
        ({"headers": {"Key": "é" * 4_095}}, "(UTF-8), not 8193"),
        ({"headers": {"": "v"}}, "headers: a name must be a non-empty string"),
        ({"headers": {"Key": 1}}, "headers.Key: must be a string, not int"),
        ({"user_id": 42}, "user_id: must be a non-empty string"),
        ({"user_id": ""}, "user_id: must be a non-empty string"),
        ({"message_id": "x" * 257}, "message_id: at most 256 characters, not 257"),
        ({"user_id": "a,b"}, "user_id: must not hold a comma or a line break"),
        ({"application_id": "a\nb"}, "application_id: must not hold a comma or a line break"),
    ],
)
def test_bad_headers_or_ids_are_refused_naming_the_field(extra: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        validate_message({"name": "N", "audience": [], **extra})


def test_the_bounds_of_headers_and_ids_are_arguments() -> None:
    document = {"name": "N", "audience": [], "headers": {"A": "1", "B": "2"}, "user_id": "abc"}
    with pytest.raises(ValueError, match="headers: at most 1 headers, not 2"):
        validate_message(document, max_headers=1)
    with pytest.raises(ValueError, match="headers: at most 3 bytes"):
        validate_message(document, max_header_bytes=3)
    with pytest.raises(ValueError, match="user_id: at most 2 characters"):
        validate_message(document, max_id_length=2)


def test_a_bad_header_in_a_batch_is_named_after_the_message_s_index() -> None:
    with pytest.raises(ValueError, match=re.escape("3.headers.Key: must be a string")):
        validate_message({"name": "N", "audience": [], "headers": {"Key": None}}, prefix="3")


# -- names: the one rule of every way in (issue 27) ---------------------------------------------

FORGING_NAMES = [
    "/chat/room1,7,ADMIN,admin-app,m-9,1700000000",  # Gobbler's first line is comma-separated
    "/chat/room1\n{}\nforged body",  # Gobbler's lines; SSE's `event:` line
    "news\r\nevent: alert",
    "a\x00b",
    "a\tb",
    "a\x1bb",
    "a\x7fb",
    "a\x85b",  # NEL, a C1 line break
    "a\x9bb",  # CSI, a C1 control
    "admin\u202egnp.exe",  # RIGHT-TO-LEFT OVERRIDE
    "a\u2066b",  # LEFT-TO-RIGHT ISOLATE
    "a\u200fb",  # RIGHT-TO-LEFT MARK
    "a\u2028b",  # LINE SEPARATOR: a line break for JavaScript
    "é,è",
]


@pytest.mark.parametrize("name", FORGING_NAMES)
def test_a_name_that_could_forge_a_frame_or_a_field_is_refused(name: str) -> None:
    assert name_error(name) is not None and name_error(name, client=True) is not None
    for audience in ([{"a": 1}], [{"a": 1}, {"b": object()}]):  # the fast path, the schema
        with pytest.raises(ValueError, match=r"^name: .* must not hold a comma or a line break"):
            validate_message({"name": name, "audience": audience})


@pytest.mark.parametrize(
    "name", ["/chat/room1/", "/chat//room1", "/", "//chat", "chat/", "a/+/b", "#", "a/#"]
)
def test_empty_levels_but_the_first_and_wildcard_levels_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"^name: .* has (an empty level|a \+ or # level)"):
        validate_message({"name": name, "audience": []})


@pytest.mark.parametrize(
    "name",
    [
        "/chat/room1",  # Gobbler's leading /: an empty first level
        "quotes/forex/EURUSD",
        "user joined",  # spaces
        "Grüße/日本語/мир",  # any letter
        "family/👨\u200d👩\u200d👧",  # an emoji sequence joined by ZWJ
        "a#b/c+d",  # + and # inside a level
        "price: $42",
        "__disconnect",
        "$remote/s-1/rx/dm",
    ],
)
def test_valid_names_stay_valid(name: str) -> None:
    assert name_error(name) is None
    assert validate_message({"name": name, "audience": []}).name == name
    assert _plainly_valid({"name": name, "audience": []}) is not None


@pytest.mark.parametrize("name", ["__disconnect", "__position", "$remote/s-1/rx/alerts", "$x"])
def test_a_client_may_publish_neither_gateway_nor_dollar_names(name: str) -> None:
    with pytest.raises(ValueError, match=r"^name: .* a client may not publish names starting"):
        validate_message({"name": name, "audience": []}, client=True)
    with pytest.raises(ValueError, match=r"^2\.name: .* a client may not publish"):
        validate_message({"name": name, "audience": []}, client=True, prefix="2")


def test_a_client_s_valid_name_is_taken() -> None:
    assert validate_message({"name": "/chat/room1", "audience": []}, client=True).name == (
        "/chat/room1"
    )


@pytest.mark.parametrize("value", ["a\x00b", "admin\u202e", "a\x85b", "a\u2028b", "a\tb"])
@pytest.mark.parametrize("key", ["user_id", "application_id", "message_id"])
def test_publisher_ids_are_held_to_the_same_characters(key: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"^{key}: must not hold a comma or a line break"):
        validate_message({"name": "N", "audience": [], key: value})
