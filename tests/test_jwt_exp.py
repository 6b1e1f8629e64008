"""The bundled JWT outbound copies a token's ``exp`` into the listener details as ``exp``, an int of
seconds since the Unix epoch (protocol 2: the gateway asks the socket to re-authenticate then, and
refuses a details ``exp`` of another type), delayed by the outbound's leeway."""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest
from bow_gateway.outbounds.jwt import JwtOutbound, mint

from bow_gateway.core.codes import TokenExpired

from .support import SECRET


def signed(**claims: Any) -> str:
    return jwt.encode({"sub": "USER/1", **claims}, SECRET, algorithm="HS256")


def test_the_exp_claim_becomes_the_details_exp() -> None:
    token = mint("USER/1", SECRET, ttl=600)
    details = JwtOutbound(secret=SECRET)(token)
    assert details["exp"] == details["claims"]["exp"]
    assert type(details["exp"]) is int
    assert abs(details["exp"] - (time.time() + 600)) <= 2


def test_no_exp_claim_no_details_exp() -> None:
    details = JwtOutbound(secret=SECRET)(signed())
    assert "exp" not in details
    assert details == {"id": "USER/1", "claims": {"sub": "USER/1"}}


@pytest.mark.parametrize(
    ("claim", "expected"),
    [
        # PyJWT takes whatever int() takes: the details hold the int, never a float or a string.
        (4_000_000_000.75, 4_000_000_000),
        ("4000000000", 4_000_000_000),
        (4_000_000_000, 4_000_000_000),
    ],
)
def test_a_float_or_numeric_string_exp_becomes_an_int(claim: object, expected: int) -> None:
    details = JwtOutbound(secret=SECRET)(signed(exp=claim))
    assert details["exp"] == expected and type(details["exp"]) is int
    assert details["claims"]["exp"] == claim  # the claims are left as the token has them


@pytest.mark.parametrize("claim", ["soon", [1], {"at": 1}])
def test_an_exp_int_cannot_take_is_refused(claim: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        JwtOutbound(secret=SECRET)(signed(exp=claim))


def test_the_leeway_delays_the_details_exp() -> None:
    # A token 10 s past its exp that a 30 s leeway still accepts must not be "already expired"
    # for the gateway: the details' exp is the moment this outbound stops accepting it.
    exp = int(time.time()) - 10
    token = signed(exp=exp)
    with pytest.raises(ValueError, match="expired"):
        JwtOutbound(secret=SECRET)(token)
    assert JwtOutbound(secret=SECRET, leeway=30)(token)["exp"] == exp + 30
    assert JwtOutbound(secret=SECRET, leeway=30.9)(token)["exp"] == exp + 30  # never later


def test_an_expired_token_raises_token_expired_a_value_error() -> None:
    # The gateway refuses it with 4003 token_expired (docs/protocol-2.md), not 4002.
    token = signed(exp=int(time.time()) - 10)
    with pytest.raises(TokenExpired, match="expired") as raised:
        JwtOutbound(secret=SECRET)(token)
    assert isinstance(raised.value, ValueError)
    with pytest.raises(ValueError) as other:  # any other invalid token: not TokenExpired
        JwtOutbound(secret=SECRET)(signed(exp=int(time.time()) + 60) + "x")
    assert not isinstance(other.value, TokenExpired)
