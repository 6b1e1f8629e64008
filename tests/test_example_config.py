"""deploy/gateway.example.toml names every key of the configuration schema and every variable
``bow-gateway serve --help`` lists, set or commented out, so that it cannot drift from them; its
commented-out Gobbler inbound and history, put back, serve the README's tour."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from marshmallow import Schema, fields

from bow_gateway.cli import main
from bow_gateway.runtime.config_schema import _ConfigSchema, _HttpsSchema

from .support import SECRET, token
from .support.cli import run
from .support.served import clean_env, serve

EXAMPLE = Path(__file__).resolve().parent.parent / "deploy" / "gateway.example.toml"

# A commented-out key or table: "# key = value" or "# [table]" / "# [[tables]]".
COMMENTED = re.compile(r"^# ?((?:\[\[?[A-Za-z_.]+\]\]?)|(?:[A-Za-z_][A-Za-z0-9_]* = .*))$")

# The plugin tables of a standalone file (bow_gateway/app/plugin_tables.py), beside the schema's
# keys.
PLUGIN_TABLES = {
    "middlewares": {"version", "create_criteria_from_listener_details", "options"},
    "inbounds": {
        "path",
        "create_message_from_request_body",
        "create_message_from_request",
        "middleware_version",
        "options",
    },
    "outbounds": {
        "version",
        "create_listener_details_from_token",
        "middleware_version",
        "options",
    },
    "enrichers": {"filter", "enrich", "init", "options"},
}


def uncommented() -> dict[str, Any]:
    """The example with every commented-out key and table put back, parsed as TOML."""
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        match = COMMENTED.match(line)
        lines.append(match.group(1) if match else line)
    return tomllib.loads("\n".join(lines))


def schema_keys() -> dict[str, set[str]]:
    """Each section of the configuration schema (``""`` for the top level) to its keys."""
    keys: dict[str, set[str]] = {"": set()}
    for key, field in _ConfigSchema().fields.items():
        keys[""].add(key)
        if key == "https":
            keys[key] = set(_HttpsSchema().fields)
        elif isinstance(field, fields.Nested):
            assert isinstance(field.schema, Schema)  # a table (outbound: its protocols' paths too)
            keys[key] = set(field.schema.fields)
    return keys


def test_the_uncommenting_finds_what_is_commented_out() -> None:
    document = uncommented()
    assert document["http_timeout"] == 10  # commented out at the top level
    assert document["inbound"]["max_queries"] == 1000  # commented out in a table
    assert document["https"]["certfile"]  # a commented-out table
    assert len(document["outbounds"]) == 2  # and a commented-out array table


def test_every_key_of_the_schema_is_in_the_example() -> None:
    document = uncommented()
    for section, keys in schema_keys().items():
        table = document if section == "" else document.get(section)
        assert isinstance(table, dict), f"no [{section}] table in {EXAMPLE.name}"
        missing = keys - table.keys()
        assert not missing, f"[{section or 'top level'}] lacks {sorted(missing)}"
        unknown = (
            set(table) - keys - (set(PLUGIN_TABLES) | {"health_check"} if not section else set())
        )
        assert not unknown, f"[{section or 'top level'}] has keys the schema lacks: {unknown}"


def test_every_plugin_table_key_is_in_the_example() -> None:
    document = uncommented()
    assert document["health_check"]
    every: set[str] = set()
    for name, keys in PLUGIN_TABLES.items():
        seen = {key for table in document[name] for key in table}
        every |= seen
        # options (a factory's arguments) is shown once, where a bundled plugin takes some.
        missing, extra = keys - seen - {"options"}, seen - keys
        assert not missing and not extra, f"[[{name}]]: {missing} missing, {extra} extra"
    assert "options" in every


def test_every_variable_serve_help_lists_is_in_the_example(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--help"]) == 0
    listed = set(re.findall(r"\bBOW_[A-Z_]+\b", capsys.readouterr().out))
    assert {"BOW_PORT", "BOW_OUTBOUND_TRANSPORTS", "BOW_CONFIG", "BOW_JWT_SECRET"} <= listed
    text = EXAMPLE.read_text()
    named = set(re.findall(r"\bBOW_[A-Z_]+\b", text))
    assert not listed - named, f"{EXAMPLE.name} lacks {sorted(listed - named)}"
    # Any other variable it names is one a plugin table reads (secret_env, dsn_env, ...).
    for variable in named - listed:
        assert re.search(rf'_env = "{variable}"', text), f"{variable} is neither"


def with_tables_uncommented(*tables: str) -> str:
    """The example with only the commented-out tables ``# [[name]]`` of ``tables`` put back."""
    lines = EXAMPLE.read_text().splitlines()
    for table in tables:
        start = f"# [[{table}]]"
        assert lines.count(start) == 1, f"{EXAMPLE.name}: {lines.count(start)} {start!r} lines"
        at = lines.index(start)
        while at < len(lines) and (match := COMMENTED.match(lines[at])):
            lines[at] = match.group(1)
            at += 1
    return "\n".join(lines) + "\n"


async def test_the_gobbler_inbound_and_history_uncommented_serve_the_tour(tmp_path: Path) -> None:
    """As the embedded default: a push to chat/room1 is kept in the history of /chat/room1."""
    config = tmp_path / "gateway.toml"
    config.write_text(with_tables_uncommented("inbounds", "history"))
    env = clean_env(BOW_JWT_SECRET=SECRET)
    with serve(tmp_path, "--config", str(config), BOW_JWT_SECRET=SECRET) as served:
        url = ["--url", served.url]
        pushed = await run("push", *url, "--topic", "chat/room1", "--body", "hello", env=env)
        assert pushed.code == 0, pushed.err  # POST /api/message/chat/room1 answered 204
        listener = ["--token", token("USER/1", {"role": "admin"})]
        kept = await run("history", "/chat/room1", *url, *listener, env=env)
    assert kept.code == 0, kept.err
    assert json.loads(kept.out) == {"event": "/chat/room1", "data": "hello", "sequence": 1}
