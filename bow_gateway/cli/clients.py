"""``token`` (mint a JWT), and what ``listen`` and ``push`` (in their own modules) share with it:
minting, the signing secret, JSON options."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from ..app.standalone_defaults import DEV_JWT_SECRET, JWT_SECRET_ENV
from .common import EXAMPLE_CRITERIA, UsageError

# -- token --------------------------------------------------------------------------------------


def token(args: argparse.Namespace) -> int:
    criteria = json_object(args.criteria, "--criteria") if args.criteria is not None else {}
    if args.ttl < 1:
        raise UsageError("--ttl must be a positive number of seconds (at least 1)")
    print(mint(args.id, signing_secret(args.secret), criteria, ttl=args.ttl))
    return 0


def mint(listener_id: str, secret: str, criteria: Mapping[str, Any], ttl: float = 3600) -> str:
    """``bow_gateway.outbounds.jwt.mint``, imported by name: mypy sees the bundled plugins as the
    top-level packages of the repository, not under ``bow_gateway``."""
    jwt_outbound = importlib.import_module("bow_gateway.outbounds.jwt")
    token: str = jwt_outbound.mint(listener_id, secret, criteria=criteria, ttl=ttl)
    return token


def signing_secret(given: str | None) -> str:
    """The HS256 secret to sign with: ``--secret``, else ``$BOW_JWT_SECRET``, else the development
    one. One too short to be safe (RFC 7518) is a usage error: the gateway would refuse it."""
    jwt_outbound = importlib.import_module("bow_gateway.outbounds.jwt")
    secret = given or os.environ.get(JWT_SECRET_ENV)
    if secret:
        try:
            jwt_outbound.check_secret(secret, source="--secret" if given else f"${JWT_SECRET_ENV}")
        except ValueError as error:
            raise UsageError(str(error)) from None
        return secret
    print(
        f"bow-gateway: signing with the development secret ({JWT_SECRET_ENV} is not set)",
        file=sys.stderr,
    )
    return DEV_JWT_SECRET


# -- shared -------------------------------------------------------------------------------------


def json_value(text: str, option: str) -> Any:
    """An option's JSON value; a usage error naming the option if it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{option} is not valid JSON ({error}): {text}") from None


def json_object(text: str, option: str) -> dict[str, Any]:
    value = json_value(text, option)
    if not isinstance(value, dict):
        raise UsageError(f"{option} must be a JSON object, like {EXAMPLE_CRITERIA}: {text}")
    return value
