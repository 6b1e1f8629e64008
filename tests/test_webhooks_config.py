"""``[[webhooks]]`` and ``presence.offline_grace``: checked at start, a bad value refused naming
the setting (never quoting a secret), from ``Bow(config)``, a TOML file and the environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bow_gateway import Bow
from bow_gateway.app.standalone import load_settings

from .support import base_config
from .support.cli import run
from .support.served import clean_env
from .support.webhooks import WH_SECRET, webhook_table

BAD_SECRET = "whsec_" + "c2hvcnQtc2VjcmV0"  # base64 of 12 bytes: too short


def test_a_webhook_table_is_loaded_with_its_defaults() -> None:
    config = Bow(base_config(webhooks=[webhook_table("https://example.com/hook")])).config
    (webhook,) = config.webhooks
    assert (webhook.url, webhook.timeout, webhook.max_attempts, webhook.max_concurrency) == (
        "https://example.com/hook",
        5.0,
        8,
        16,
    )
    assert WH_SECRET not in repr(config)


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ({"secret": BAD_SECRET}, "webhooks.0.secret"),
        ({"secret": "c2hvcnQtc2VjcmV0c2hvcnQtc2VjcmV0c2hvcnQ="}, "webhooks.0.secret"),
        ({"url": "ftp://example.com/"}, "webhooks.0.url"),
        ({"events": []}, "webhooks.0.events"),
        ({"events": ["message.sent"]}, "webhooks.0.events"),
        ({"timeout": 0}, "webhooks.0.timeout"),
        ({"max_attempts": 0}, "webhooks.0.max_attempts"),
        ({"colour": "red"}, "webhooks.0: unknown key 'colour'"),
    ],
)
def test_a_bad_webhook_setting_is_refused_naming_it(table: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named) as refused:
        Bow(base_config(webhooks=[{**webhook_table("https://example.com/hook"), **table}]))
    assert BAD_SECRET not in str(refused.value)


def test_two_tables_with_one_url_are_refused() -> None:
    table = webhook_table("https://example.com/hook")
    with pytest.raises(ValueError, match=r"webhooks\.1\.url"):
        Bow(base_config(webhooks=[table, table]))


async def test_serve_refuses_a_bad_secret_naming_the_setting(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        'port = 0\n[inbound]\nrealm = "r"\nusername = "u"\npassword = "p"\n'
        '[outbound]\ntimeout = 5\n[[inbounds]]\npath = "/m"\nmiddleware_version = "v1"\n'
        'create_message_from_request_body = "bow_gateway.inbounds.passthrough:'
        'create_message_from_request_body"\n[[middlewares]]\nversion = "v1"\n'
        'create_criteria_from_listener_details = "bow_gateway.middlewares.claims:'
        'criteria_from_claim"\n'
        f'[[webhooks]]\nurl = "https://example.com/hook"\nsecret = "{BAD_SECRET}"\n'
        'events = ["listener.online"]\n'
    )
    result = await run("serve", "--config", str(config), env=clean_env())
    assert result.code == 2 and "webhooks.0.secret" in result.err
    assert BAD_SECRET not in result.err + result.out


def test_bow_webhooks_takes_the_list_as_json() -> None:
    tables = [webhook_table("https://example.com/hook", ["listener.offline"])]
    settings = load_settings(None, {"BOW_WEBHOOKS": json.dumps(tables)})
    (webhook,) = Bow(settings.config).config.webhooks
    assert webhook.events == frozenset({"listener.offline"})


def test_offline_grace_defaults_to_5_s_and_comes_from_the_environment() -> None:
    assert Bow(base_config()).config.offline_grace == 5.0
    settings = load_settings(None, {"BOW_PRESENCE_OFFLINE_GRACE": "2.5"})
    assert Bow(settings.config).config.offline_grace == 2.5


@pytest.mark.parametrize("grace", [0, -1, 3601])
def test_an_offline_grace_out_of_range_is_refused(grace: float) -> None:
    with pytest.raises(ValueError, match="offline_grace"):
        Bow(base_config(presence={"offline_grace": grace}))
