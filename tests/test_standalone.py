"""Standalone mode: settings from a TOML file, the environment, and the embedded default."""

from __future__ import annotations

import logging
import sys
import textwrap
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from bow_gateway.outbounds.jwt import mint

from bow_gateway import Bow
from bow_gateway.app.standalone import Settings, build_bow, environment_variables, load_settings
from bow_gateway.app.standalone_defaults import DEV_JWT_SECRET

from .support import SECRET, Listener

EXAMPLE = Path(__file__).resolve().parent.parent / "deploy" / "gateway.example.toml"

StartBow = Callable[[Bow], Awaitable[Bow]]


def write_plugins(folder: Path) -> str:
    """A plugin module beside the config file, under a name no other test has imported."""
    name = f"plugins_{uuid.uuid4().hex}"
    (folder / f"{name}.py").write_text(
        textwrap.dedent(
            """
            def make_criteria(team, extra=None):
                def criteria(details):
                    return {"team": team, "role": details["claims"].get("role", "guest")}
                return criteria

            def message(body):
                return {"name": body["event"], "payload": body.get("data"), "audience": body["to"]}

            def health(request):
                return {"status": "fine"}

            NOT_A_FUNCTION = 42
            """
        )
    )
    return name


def write_config(folder: Path, text: str) -> str:
    path = folder / "gateway.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def plugin_config(module: str) -> str:
    return f"""
        port = 0
        host = "127.0.0.1"
        namespace = "test"
        health_check = "{module}:health"

        [middleware]
        log_interval = 0

        [inbound]
        realm = "Test platform"
        username = "pusher"
        password = "from-the-file"
        max_body_size = 4096

        [outbound]
        timeout = 3

        [[middlewares]]
        version = "v2"
        create_criteria_from_listener_details = "{module}:make_criteria"
        options = {{ team = "blue" }}

        [[inbounds]]
        path = "/v2/events"
        create_message_from_request_body = "{module}:message"
        middleware_version = "v2"

        [[outbounds]]
        version = "v2.1"
        create_listener_details_from_token = "bow_gateway.outbounds.jwt:JwtOutbound"
        options = {{ secret = "{SECRET}", algorithms = ["HS256"] }}
        middleware_version = "v2"
    """


def auth(password: str, user: str = "pusher") -> dict[str, str]:
    return {"Authorization": aiohttp.encode_basic_auth(user, password)}


async def test_a_file_with_plugins_and_options_serves(
    tmp_path: Path, start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    module = write_plugins(tmp_path)
    path = write_config(tmp_path, plugin_config(module))
    path_before = list(sys.path)

    settings = load_settings(path, environ={})

    assert sys.path == path_before  # the config's folder was only borrowed for the imports
    assert settings.source == path
    assert settings.environment == {}
    assert [m.version for m in settings.middlewares] == ["v2"]
    assert [(i.path, i.middleware_version) for i in settings.inbounds] == [("/v2/events", "v2")]
    assert [(o.version, o.reference) for o in settings.outbounds] == [
        ("v2.1", "bow_gateway.outbounds.jwt:JwtOutbound")
    ]
    # options: the factory was called once, and its result is the function
    assert settings.middlewares[0].create_criteria_from_listener_details({"claims": {}}) == {
        "team": "blue",
        "role": "guest",
    }

    bow = await start_bow(build_bow(settings))
    assert bow.config.namespace == "test" and bow.config.max_body_size == 4096
    url = f"http://127.0.0.1:{bow.port}"
    async with http.get(url + "/health") as response:
        assert response.status == 200
        assert await response.json() == {"status": "fine"}

    listener = Listener(url)
    try:
        await listener.connect("v2.1")
        await listener.authenticate(mint("USER/7", SECRET, extra={"role": "admin"}))
        body = {"event": "news", "data": {"n": 1}, "to": [{"team": "blue", "role": "admin"}]}
        async with http.post(url + "/v2/events", json=body, headers=auth("from-the-file")) as r:
            assert r.status == 204
        assert await listener.next_event() == ("news", {"n": 1})
    finally:
        await listener.close()


def test_environment_variables_override_the_file(tmp_path: Path) -> None:
    module = write_plugins(tmp_path)
    path = write_config(tmp_path, plugin_config(module))
    environ = {
        "BOW_PORT": "8181",
        "BOW_HOST": "0.0.0.0",
        "BOW_NAMESPACE": "other",
        "BOW_REDIS_URL": "redis://redis.example:6379/2",
        "BOW_LOG_INTERVAL": "15",
        "BOW_INBOUND_REALM": "Env realm",
        "BOW_INBOUND_USERNAME": "env-pusher",
        "BOW_INBOUND_PASSWORD": "from-the-env",
        "BOW_INBOUND_MAX_BODY_SIZE": "2048",
        "BOW_OUTBOUND_TIMEOUT": "7.5",
        "BOW_HTTPS_CERTFILE": "/etc/cert.pem",
        "BOW_HTTPS_KEYFILE": "/etc/key.pem",
        "BOW_INBOUND_TIMEOUT": "",  # empty: unset
        "BOW_UNRELATED": "ignored",
    }

    settings = load_settings(path, environ)

    config = build_bow(settings).config
    assert (config.port, config.host, config.namespace) == (8181, "0.0.0.0", "other")
    assert config.redis == "redis://redis.example:6379/2"
    assert config.log_interval == 15
    assert (config.realm, config.username, config.password) == (
        "Env realm",
        "env-pusher",
        "from-the-env",
    )
    assert config.max_body_size == 2048
    assert config.inbound_timeout == 5  # the default: the empty variable counts as unset
    assert config.auth_timeout == 7.5
    assert config.https == {"certfile": "/etc/cert.pem", "keyfile": "/etc/key.pem"}
    assert settings.environment["inbound.password"] == "BOW_INBOUND_PASSWORD"
    assert settings.environment["port"] == "BOW_PORT"
    assert "inbound.timeout" not in settings.environment


def test_every_documented_variable_is_derived_from_the_configuration() -> None:
    names = environment_variables()
    documented = {
        "BOW_PORT": ("port",),
        "BOW_HOST": ("host",),
        "BOW_REDIS_URL": ("redis",),
        "BOW_NAMESPACE": ("namespace",),
        "BOW_LOG_INTERVAL": ("middleware", "log_interval"),
        "BOW_INBOUND_REALM": ("inbound", "realm"),
        "BOW_INBOUND_USERNAME": ("inbound", "username"),
        "BOW_INBOUND_PASSWORD": ("inbound", "password"),
        "BOW_INBOUND_MAX_BODY_SIZE": ("inbound", "max_body_size"),
        "BOW_OUTBOUND_TIMEOUT": ("outbound", "timeout"),
        "BOW_HTTPS_CERTFILE": ("https", "certfile"),
        "BOW_HTTPS_KEYFILE": ("https", "keyfile"),
    }
    assert documented.items() <= names.items()
    assert all(name.startswith("BOW_") for name in names)


def test_the_recovery_and_api_sections_are_set_from_the_environment() -> None:
    environ = {
        "BOW_RECOVERY_ENABLED": "false",
        "BOW_RECOVERY_MAX_REPLAY": "50",
        "BOW_API_PREFIX": "/_control",
        "BOW_API_COUNT_TIMEOUT": "1.5",
        "BOW_OUTBOUND_MAX_EVENT_BYTES": "1024",
    }
    settings = load_settings(None, environ)
    config = build_bow(settings).config
    assert (config.recovery_enabled, config.recovery_max_replay) == (False, 50)
    assert (config.api_prefix, config.count_timeout) == ("/_control", 1.5)
    assert config.max_event_bytes == 1024
    assert settings.environment["api.prefix"] == "BOW_API_PREFIX"
    with pytest.raises(ValueError, match=r"api.prefix: .*api.prefix is set by BOW_API_PREFIX"):
        load_settings(None, {"BOW_API_PREFIX": "/"})


def test_a_bad_value_from_the_environment_names_the_variable() -> None:
    with pytest.raises(ValueError, match=r"port: .*port is set by BOW_PORT"):
        load_settings(None, {"BOW_PORT": "eighty"})


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        (
            'create_listener_details_from_token = "no_such_module_here:f"',
            r"\[\[outbounds\]\] #1: cannot import 'no_such_module_here:f': ModuleNotFoundError",
        ),
        (
            'create_listener_details_from_token = "bow_gateway.outbounds.jwt:Missing"',
            r"\[\[outbounds\]\] #1: cannot import 'bow_gateway.outbounds.jwt:Missing': "
            r".*no attribute 'Missing'",
        ),
        (
            'create_listener_details_from_token = "bow_gateway.outbounds.jwt"',
            r"\[\[outbounds\]\] #1: .*'bow_gateway.outbounds.jwt' must look like "
            r"'module:attribute'",
        ),
        (
            'create_listener_details_from_token = "bow_gateway.outbounds.jwt:JwtOutbound"\n'
            'options = { secret_env = "BOW_TEST_UNSET_VARIABLE" }',
            r"\[\[outbounds\]\] #1: bow_gateway.outbounds.jwt:JwtOutbound\(\*\*options\) failed: "
            r"ValueError: .*BOW_TEST_UNSET_VARIABLE",
        ),
        (
            'create_listener_details_from_token = "bow_gateway.outbounds.jwt:JwtOutbound"\n'
            "options = { no_such_option = 1 }",
            r"\[\[outbounds\]\] #1: .*JwtOutbound\(\*\*options\) failed: TypeError",
        ),
        (
            'create_listener_details_from_token = "{module}:NOT_A_FUNCTION"',
            r"\[\[outbounds\]\] #1: {module}:NOT_A_FUNCTION is a int, not a function",
        ),
        (
            'create_listener_details_from_token = "{module}:message"\nverison = "v1"',
            r"\[\[outbounds\]\] #1: unknown key 'verison'",
        ),
    ],
)
def test_a_bad_plugin_names_its_table_and_reference(
    tmp_path: Path, table: str, expected: str
) -> None:
    module = write_plugins(tmp_path)
    path = write_config(
        tmp_path,
        f"""
        port = 0
        [inbound]
        realm = "r"
        username = "u"
        password = "p"
        [outbound]
        timeout = 1
        [[middlewares]]
        version = "v1"
        create_criteria_from_listener_details = "{module}:make_criteria"
        options = {{ team = "red" }}
        [[outbounds]]
        version = "v1"
        middleware_version = "v1"
        """
        + table.replace("{module}", module),
    )
    with pytest.raises(ValueError, match=expected.replace("{module}", module)) as raised:
        load_settings(path, environ={})
    assert str(raised.value).startswith(path + ": ")


@pytest.mark.parametrize(
    ("path", "middlewares", "expected"),
    [
        ("/v1/messages", 2, r"\[\[middlewares\]\] #2: .*'v1' is already registered"),
        ("/health", 1, r"\[\[inbounds\]\] #1: .*'/health' is reserved"),
    ],
)
def test_registration_errors_name_the_table(
    tmp_path: Path, path: str, middlewares: int, expected: str
) -> None:
    module = write_plugins(tmp_path)
    middleware = f"""
        [[middlewares]]
        version = "v1"
        create_criteria_from_listener_details = "{module}:make_criteria"
        options = {{ team = "red" }}
        """
    config = write_config(
        tmp_path,
        f"""
        port = 0
        [inbound]
        realm = "r"
        username = "u"
        password = "p"
        [outbound]
        timeout = 1
        [[inbounds]]
        path = "{path}"
        create_message_from_request_body = "{module}:message"
        middleware_version = "v1"
        """
        + middleware * middlewares,
    )
    settings = load_settings(config, environ={})
    with pytest.raises(ValueError, match=expected):
        build_bow(settings)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("port = ", r"is not valid TOML"),
        ("port = 0\n[inbound]\nrealm = 'r'\n", r"invalid configuration: .*inbound\."),
        (
            "port = 0\nprot = 1\n[inbound]\nrealm='r'\nusername='u'\npassword='p'\n"
            "[outbound]\ntimeout=1\n",
            r"prot: Unknown field",
        ),
        (
            "port = 0\n[inbound]\nrealm='r'\nusername='u'\npassword='p'\n[outbound]\ntimeout=1\n",
            r"there is no \[\[inbounds\]\] and no \[\[outbounds\]\] table",
        ),
        (
            "port = 0\ninbounds = 'x'\n[inbound]\nrealm='r'\nusername='u'\npassword='p'\n"
            "[outbound]\ntimeout=1\n",
            r"inbounds must be a list of tables",
        ),
    ],
)
def test_a_bad_file_is_a_value_error_naming_the_file(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = write_config(tmp_path, text)
    with pytest.raises(ValueError, match=expected) as raised:
        load_settings(path, environ={})
    assert path in str(raised.value)


def test_a_missing_file_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read the config file .*nowhere.toml"):
        load_settings(str(tmp_path / "nowhere.toml"), environ={})


async def test_the_embedded_default_serves_with_the_documented_credentials(
    start_bow: StartBow, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="bow_gateway.standalone"):
        settings = load_settings(None, environ={})
    assert "BOW_JWT_SECRET is not set" in caplog.text
    assert settings.source is None and settings.uses_dev_secret

    bow = build_bow(settings)
    config = bow.config
    assert (config.host, config.port, config.redis) == ("127.0.0.1", 8080, None)
    assert (config.realm, config.username) == ("bow-gateway", "pusher")
    assert config.password == "change-me"
    assert (config.auth_timeout, config.log_interval) == (5, 60)

    bow = await start_bow(build_bow(settings.with_address(port=0)))
    url = f"http://127.0.0.1:{bow.port}"
    listener = Listener(url)
    try:
        await listener.connect("v1")
        await listener.authenticate(mint("USER/1", DEV_JWT_SECRET, criteria={"role": "admin"}))
        body = {"name": "greeting", "audience": [{"role": "admin"}], "text": "hello"}
        async with http.post(url + "/v1/messages", json=body, headers=auth("change-me")) as r:
            assert r.status == 204
        assert await listener.next_event() == ("greeting", body)
    finally:
        await listener.close()


async def test_the_embedded_default_takes_its_secrets_from_the_environment(
    start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    settings = load_settings(
        None, environ={"BOW_JWT_SECRET": SECRET, "BOW_INBOUND_PASSWORD": "env-password"}
    )
    assert not settings.uses_dev_secret
    bow = await start_bow(build_bow(settings.with_address(port=0)))
    url = f"http://127.0.0.1:{bow.port}"

    async with http.post(url + "/v1/messages", json={}, headers=auth("change-me")) as response:
        assert response.status == 401
    body: dict[str, Any] = {"name": "n", "audience": []}
    async with http.post(url + "/v1/messages", json=body, headers=auth("env-password")) as r:
        assert r.status == 204

    refused, accepted = Listener(url), Listener(url)
    try:
        await refused.connect("v1")
        await refused.client.emit("authenticate", mint("USER/1", DEV_JWT_SECRET))
        event, _ = await refused.next_event()
        assert event == "alert"
        await accepted.connect("v1")
        await accepted.authenticate(mint("USER/2", SECRET))
    finally:
        await refused.close()
        await accepted.close()


async def test_the_example_file_works(
    monkeypatch: pytest.MonkeyPatch, start_bow: StartBow, http: aiohttp.ClientSession
) -> None:
    monkeypatch.delenv("BOW_JWT_SECRET", raising=False)
    with pytest.raises(ValueError, match=r"\[\[outbounds\]\] #1: .*BOW_JWT_SECRET"):
        load_settings(str(EXAMPLE), environ={})

    monkeypatch.setenv("BOW_JWT_SECRET", SECRET)
    settings = load_settings(str(EXAMPLE), environ={"BOW_PORT": "0"})
    assert isinstance(settings, Settings)
    bow = await start_bow(build_bow(settings))
    url = f"http://127.0.0.1:{bow.port}"
    async with http.get(url + "/health") as response:
        assert response.status == 200

    listener = Listener(url)
    try:
        await listener.connect("v1")
        await listener.authenticate(mint("USER/1", SECRET, criteria={"role": "admin"}))
        body = {"name": "greeting", "audience": [{"role": "admin"}]}
        async with http.post(url + "/v1/messages", json=body, headers=auth("change-me")) as r:
            assert r.status == 204
        assert await listener.next_event() == ("greeting", body)
    finally:
        await listener.close()


# -- documented secrets: a loud warning that never quotes them ------------------------------------


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "bow_gateway.standalone" and record.levelno == logging.WARNING
    ]


def test_a_file_that_keeps_the_documented_password_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("BOW_JWT_SECRET", SECRET)
    with caplog.at_level(logging.WARNING, logger="bow_gateway.standalone"):
        load_settings(str(EXAMPLE), environ={"BOW_JWT_SECRET": SECRET})
    [warning] = warnings_of(caplog)
    assert "inbound.password" in warning and str(EXAMPLE) in warning
    assert "change-me" not in caplog.text


def test_a_documented_jwt_secret_from_the_environment_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("BOW_JWT_SECRET", DEV_JWT_SECRET)
    environ = {"BOW_JWT_SECRET": DEV_JWT_SECRET, "BOW_INBOUND_PASSWORD": "own-password"}
    with caplog.at_level(logging.WARNING, logger="bow_gateway.standalone"):
        load_settings(str(EXAMPLE), environ=environ)
    [warning] = warnings_of(caplog)
    assert "[[outbounds]] #1" in warning and "$BOW_JWT_SECRET" in warning
    assert DEV_JWT_SECRET not in caplog.text


def test_the_embedded_default_warns_of_both_secrets_without_quoting_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="bow_gateway.standalone"):
        load_settings(None, environ={})
    password, secret = warnings_of(caplog)
    assert "inbound.password" in password and "BOW_INBOUND_PASSWORD" in password
    assert "BOW_JWT_SECRET is not set" in secret
    assert DEV_JWT_SECRET not in caplog.text and "change-me" not in caplog.text


def test_own_secrets_start_without_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("BOW_JWT_SECRET", SECRET)
    environ = {"BOW_JWT_SECRET": SECRET, "BOW_INBOUND_PASSWORD": "own-password"}
    with caplog.at_level(logging.WARNING, logger="bow_gateway.standalone"):
        load_settings(str(EXAMPLE), environ=environ)
    assert warnings_of(caplog) == []


async def test_an_outbound_table_may_give_anonymous_criteria(
    tmp_path: Path, start_bow: StartBow
) -> None:
    module = write_plugins(tmp_path)
    text = plugin_config(module).replace(
        '        middleware_version = "v2"\n    ',
        '        middleware_version = "v2"\n        anonymous_criteria = { public = true }\n    ',
    )
    settings = load_settings(write_config(tmp_path, text), environ={})
    assert settings.outbounds[0].anonymous_criteria == {"public": True}
    bow = await start_bow(build_bow(settings))
    listener = Listener(f"http://127.0.0.1:{bow.port}")
    try:
        await listener.connect("v2.1&proto=2")
        result = await listener.client.call("authenticate", (None, {}), timeout=5)
        assert result["id"] is None
    finally:
        await listener.close()


@pytest.mark.parametrize(
    ("criteria", "error"),
    [({"__id": "x"}, "must not set __id"), ({"room": {}}, "room"), ("public", "mapping")],
)
def test_bad_anonymous_criteria_are_refused_at_registration(criteria: Any, error: str) -> None:
    bow = Bow(
        {
            "port": 0,
            "inbound": {"realm": "r", "username": "u", "password": "p"},
            "outbound": {"timeout": 1},
        }
    )
    with pytest.raises(ValueError, match=f"anonymous_criteria: .*{error}"):
        bow.outbound(
            version="1",
            create_listener_details_from_token=lambda token: {"id": token},
            middleware_version="1",
            anonymous_criteria=criteria,
        )
