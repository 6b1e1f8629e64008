"""HS* secrets shorter than RFC 7518 (section 3.2) allows are refused when the outbound is built,
by ``bow-gateway token`` and ``listen``, and by ``serve``, each saying why and how to make one."""

from __future__ import annotations

from pathlib import Path

import pytest
from bow_gateway.outbounds.jwt import JwtOutbound, mint

from bow_gateway.app.standalone import load_settings
from bow_gateway.app.standalone_defaults import DEV_JWT_SECRET
from bow_gateway.cli import main

from .support import SECRET, jwt_config_file


@pytest.mark.parametrize(
    ("algorithms", "needed"),
    [(["HS256"], 32), (["HS384"], 48), (["HS512"], 64), (["HS256", "HS512"], 64)],
)
def test_a_secret_shorter_than_the_hash_is_refused_at_construction(
    algorithms: list[str], needed: int
) -> None:
    with pytest.raises(ValueError, match=rf"is {needed - 1} bytes: RFC 7518.*at least {needed}"):
        JwtOutbound(algorithms=algorithms, secret="s" * (needed - 1))
    outbound = JwtOutbound(algorithms=algorithms, secret="s" * needed)
    token = mint("USER/1", "s" * needed, algorithm=algorithms[-1])
    assert outbound(token)["id"] == "USER/1"


def test_bytes_are_counted_not_characters() -> None:
    with pytest.raises(ValueError, match="is 30 bytes"):
        JwtOutbound(secret="é" * 15)  # 15 characters, 30 bytes
    JwtOutbound(secret="é" * 16)


def test_a_short_secret_from_the_environment_names_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHORT_JWT_SECRET", "hunter2")
    with pytest.raises(ValueError, match=r"\(\$SHORT_JWT_SECRET\) is 7 bytes"):
        JwtOutbound(secret_env="SHORT_JWT_SECRET")


def test_public_key_algorithms_are_not_held_to_it() -> None:
    JwtOutbound(algorithms=["RS256"], public_key="-----BEGIN PUBLIC KEY-----")


def test_mint_refuses_a_short_secret_too() -> None:
    with pytest.raises(ValueError, match="RFC 7518"):
        mint("USER/1", "short")


def test_the_project_secrets_are_long_enough() -> None:
    assert len(SECRET.encode()) >= 32
    assert len(DEV_JWT_SECRET.encode()) >= 32


@pytest.mark.parametrize("command", ["token", "listen"])
def test_the_cli_refuses_a_short_secret_with_exit_2(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--id", "USER/1", "--secret", "short"]) == 2
    err = capsys.readouterr().err
    assert f"bow-gateway {command}: the HS256 secret (--secret) is 5 bytes" in err
    assert "secrets.token_urlsafe(32)" in err


def test_the_cli_refuses_a_short_secret_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BOW_JWT_SECRET", "0123456789")
    assert main(["token", "--id", "USER/1"]) == 2
    assert "the HS256 secret ($BOW_JWT_SECRET) is 10 bytes" in capsys.readouterr().err


def test_serve_refuses_a_short_secret_in_a_config_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\[\[outbounds\]\] #1: .*is 9 bytes: RFC 7518"):
        load_settings(jwt_config_file(tmp_path, "change-me"), environ={})
