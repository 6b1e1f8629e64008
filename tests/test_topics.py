"""Topic filters (clients.md section 11): MQTT 3.1.1 syntax, matching, and the index's cost."""

from __future__ import annotations

import random

import pytest

from bow_gateway.core.message import validate_message
from bow_gateway.core.topic_index import FilterSet, TopicIndex
from bow_gateway.core.topics import (
    MAX_FILTER_BYTES,
    MAX_FILTER_LEVELS,
    filter_matches,
    parse_filter,
)


@pytest.mark.parametrize(
    ("text", "levels"),
    [
        ("a", ("a",)),
        ("quotes/forex/EURUSD", ("quotes", "forex", "EURUSD")),
        ("#", ("#",)),
        ("+", ("+",)),
        ("a/#", ("a", "#")),
        ("+/+", ("+", "+")),
        ("/finance", ("", "finance")),
        ("a//b", ("a", "", "b")),
        ("a/", ("a", "")),
        ("/", ("", "")),
        ("sport/+/player1", ("sport", "+", "player1")),
        ("a/$b", ("a", "$b")),  # only the first level is the gateway's
        ("__position", ("__position",)),
        ("é/日本", ("é", "日本")),
    ],
)
def test_a_well_formed_filter_is_parsed_into_levels(text: str, levels: tuple[str, ...]) -> None:
    assert parse_filter(text) == levels


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "must not be empty"),
        ("a/#/b", "# must be the last level"),
        ("#/a", "# must be the last level"),
        ("a#", "# must be a whole level"),
        ("#a", "# must be a whole level"),
        ("a/b#", "# must be a whole level"),
        ("a+", "+ must be a whole level"),
        ("+a", "+ must be a whole level"),
        ("a/+b/c", "+ must be a whole level"),
        ("$SYS/#", "starting with $ are the gateway's"),
        ("$SYS", "starting with $ are the gateway's"),
        ("$remote/abc/rx/#", "starting with $ are the gateway's"),
        ("a\x00b", "NUL"),
        ("a/" * MAX_FILTER_LEVELS + "a", f"at most {MAX_FILTER_LEVELS} levels"),
        ("a" * (MAX_FILTER_BYTES + 1), f"at most {MAX_FILTER_BYTES} bytes"),
        ("é" * (MAX_FILTER_BYTES // 2 + 1), f"at most {MAX_FILTER_BYTES} bytes"),  # UTF-8 bytes
        (None, "a filter is a string, not NoneType"),
        (3, "a filter is a string, not int"),
        (["a"], "a filter is a string, not list"),
    ],
)
def test_a_malformed_filter_is_refused_saying_what_is_wrong(text: object, says: str) -> None:
    with pytest.raises(ValueError, match=None) as raised:
        parse_filter(text)
    assert says in str(raised.value)


def test_the_limits_themselves_are_allowed() -> None:
    assert len(parse_filter("/".join(["a"] * MAX_FILTER_LEVELS))) == MAX_FILTER_LEVELS
    assert parse_filter("a" * MAX_FILTER_BYTES)


# (filter, name, matches): MQTT 3.1.1 section 4.7's examples first, then the gateway's cases.
TABLE = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport", True),
    ("#", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("#", "$SYS/x", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("+", "$SYS", False),
    ("#", "$remote/abc/rx/x", False),
    ("a/#", "a/$b", True),  # $ only counts at the first level
    ("+/+", "a/$b", True),
    ("#", "/", True),
    ("/", "/", True),
    ("+/+", "/", True),
    ("#", "", True),
    ("+", "", True),
    ("a", "a", True),
    ("a", "a/b", False),
    ("a", "b", False),
    ("a", "A", False),  # case matters
    ("a/b", "a", False),
    ("a/b", "a/b/", False),
    ("a//b", "a//b", True),
    ("a/+/b", "a//b", True),
    ("quotes/forex/+", "quotes/forex/EURUSD", True),
    ("quotes/+/EURUSD", "quotes/forex/EURUSD", True),
    ("quotes/+/EURUSD", "quotes/forex/USDJPY", False),
    ("+/+/+/#", "a/b/c", True),
    ("+/+/+/#", "a/b", False),
    ("chat", "chat#1", False),  # + and # in a name are characters
    ("#", "chat#1", True),
    ("+", "a+b", True),
]


@pytest.mark.parametrize(("text", "name", "expected"), TABLE)
def test_the_matching_table(text: str, name: str, expected: bool) -> None:
    index: TopicIndex[str] = TopicIndex()
    index.add("holder", text, parse_filter(text) if not text.startswith("$") else None)
    assert (index.match(name) == {"holder"}) is expected
    assert filter_matches(tuple(text.split("/")), name) is expected
    assert FilterSet([text]).matches(name) is expected


def test_the_index_agrees_with_the_filter_one_by_one() -> None:
    """Random filters and names over a small alphabet: the trie answers as each filter does."""
    rng = random.Random(11)
    words = ["a", "b", "", "$c"]

    def level(wild: bool) -> str:
        return rng.choice(words + (["+", "+"] if wild else []))

    filters: set[str] = set()
    while len(filters) < 300:
        depth = rng.randint(1, 4)
        levels = [level(True) for _ in range(depth)]
        if rng.random() < 0.3:
            levels[-1] = "#"
        text = "/".join(levels)
        try:
            parse_filter(text)
        except ValueError:
            continue
        filters.add(text)
    index: TopicIndex[str] = TopicIndex()
    for text in filters:
        index.add(text, text)
    for _ in range(2_000):
        name = "/".join(level(False) for _ in range(rng.randint(1, 5)))
        expected = {text for text in filters if filter_matches(tuple(text.split("/")), name)}
        assert index.match(name) == expected, name


def test_holders_share_filters_and_remove_takes_the_exact_filter() -> None:
    index: TopicIndex[str] = TopicIndex()
    assert index.add("x", "sport/#")
    assert not index.add("x", "sport/#")  # already held
    assert index.add("y", "sport/#")
    assert index.add("y", "sport/+")
    assert index.match("sport/tennis") == {"x", "y"}
    assert not index.remove("x", "sport/+")  # not a subset, not a superset: exactly
    assert not index.remove("x", "sport")
    assert index.match("sport/tennis") == {"x", "y"}
    assert index.remove("x", "sport/#")
    assert index.match("sport/tennis") == {"y"}
    assert index.filters_of("y") == {"sport/#", "sport/+"}
    assert len(index) == 1 and "x" not in index and "y" in index
    index.discard("y")
    assert len(index) == 0 and index.match("sport/tennis") == set()
    assert index._root.children == {}, "every node nobody needs is pruned"


def test_narrow_keeps_holders_without_filters_and_drops_the_others_not_matching() -> None:
    index: TopicIndex[str] = TopicIndex()
    index.add("quotes", "quotes/#")
    index.add("news", "news/+")
    index.add("both", "quotes/#")
    index.add("both", "news/+")
    resolved = {"plain", "quotes", "news", "both"}
    assert index.narrow(set(resolved), "quotes/forex") == {"plain", "quotes", "both"}
    assert index.narrow(set(resolved), "news/today") == {"plain", "news", "both"}
    assert index.narrow(set(resolved), "weather") == {"plain"}
    assert index.narrow({"plain"}, "weather") == {"plain"}
    # the audience decides first: a matching filter never widens it
    assert index.narrow({"plain", "news"}, "quotes/forex") == {"plain"}


def test_match_costs_the_matching_nodes_not_the_holders_of_other_filters() -> None:
    """10,000 holders of filters that do not match: a match visits the same few nodes as with
    none, and the narrowing keeps the unfiltered ones without looking at the others' filters."""
    index: TopicIndex[int] = TopicIndex()
    index.add(-1, "quotes/forex/+")
    index.match("quotes/forex/EURUSD")
    alone = index.visited
    for holder in range(10_000):
        index.add(holder, f"news/{holder}/#")  # 10,000 distinct filters, none matching
        index.add(holder, "weather/+")
    assert index.match("quotes/forex/EURUSD") == {-1}
    assert index.visited == alone == 4  # the root, quotes, forex, +
    assert index.match("news/42") == {42}
    assert index.visited == 4  # the root, news, 42, its #
    many = set(range(10_000))
    assert index.match("weather/today") == many  # proportional to the matching holders
    assert index.visited == 3


def test_the_cost_of_a_name_is_its_levels_whatever_the_wildcards_held() -> None:
    index: TopicIndex[int] = TopicIndex()
    for holder in range(1_000):
        index.add(holder, "/".join(["+"] * 8) + f"/{holder}")
    index.match("a/b/c/d/e/f/g/h/999")
    assert index.visited == 10  # root, eight '+', and 999: not one node per holder
    index.match("a/b/c")
    assert index.visited == 4


def test_a_filter_set_answers_each_name_once() -> None:
    filters = FilterSet(["quotes/#", "news/+"])
    assert filters and not FilterSet([])
    assert FilterSet([]).matches("anything")
    assert filters.matches("quotes/forex") and filters.matches("news/x")
    assert not filters.matches("weather") and not filters.matches("news/x/y")
    assert filters.matches("quotes/forex")


@pytest.mark.parametrize(
    "name", ["$x", "$SYS/load", "$", "$remote", "$remote/abc", "$remote//rx/x", "$remote/a/tx/x"]
)
def test_the_inbound_refuses_names_of_the_gateways_topics(name: str) -> None:
    with pytest.raises(ValueError, match=r"names starting with \$ are the gateway's own topics"):
        validate_message({"name": name, "audience": [{"a": 1}]})
    with pytest.raises(ValueError, match=r"names starting with \$"):  # the schema's own words
        validate_message({"name": name, "audience": [{"a": 1}, {"b": object()}]})


@pytest.mark.parametrize("name", ["$remote/abc/rx/x", "$remote/s-1/rx/a/b", "a/$b", "/$b", "x$"])
def test_the_inbound_takes_remote_names_and_dollars_past_the_first_level(name: str) -> None:
    assert validate_message({"name": name, "audience": [{"a": 1}]}).name == name
