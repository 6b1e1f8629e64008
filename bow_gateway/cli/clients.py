"""The commands that try a gateway out: ``token`` (mint a JWT) and ``push`` (POST a message), and
what ``listen`` (in its own module) shares with them: minting, the signing secret, JSON options."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

import aiohttp

from ..standalone import DEV_INBOUND_PASSWORD, DEV_JWT_SECRET, JWT_SECRET_ENV
from .common import EXAMPLE_CRITERIA, PASSWORD_ENV, UsageError

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


# -- push ---------------------------------------------------------------------------------------


def push(args: argparse.Namespace) -> int:
    audience = _json(args.audience, "--audience")
    body: dict[str, Any] = {"name": args.name, "audience": audience}
    if args.payload is not None:
        payload = _json(args.payload, "--payload")
        if args.envelope:
            body["payload"] = payload
        elif not isinstance(payload, dict):
            raise UsageError(
                "--payload must be a JSON object: the pass-through inbound sends the body itself "
                "as the payload (use --envelope to send {name, audience, payload})"
            )
        elif {"name", "audience"} & payload.keys():
            raise UsageError("--payload must not set 'name' or 'audience': use --name, --audience")
        else:
            body.update(payload)
    password = args.password or os.environ.get(PASSWORD_ENV) or DEV_INBOUND_PASSWORD
    return asyncio.run(_post(args.url.rstrip("/") + args.path, args.user, password, body))


async def _post(url: str, user: str, password: str, body: Any) -> int:
    headers = {"Authorization": aiohttp.encode_basic_auth(user, password)}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.post(url, json=body, headers=headers) as response,
        ):
            text = (await response.text()).strip()
    except (aiohttp.ClientError, TimeoutError) as error:
        print(
            f"bow-gateway push: cannot reach {url}: {error or type(error).__name__}",
            file=sys.stderr,
        )
        return 1
    status = f"{response.status} {response.reason}"
    if response.status == 204:
        print(f"{status}: accepted")
        return 0
    print(f"bow-gateway push: {status}" + (f": {text}" if text else ""), file=sys.stderr)
    return 1


# -- shared -------------------------------------------------------------------------------------


def _json(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{option} is not valid JSON ({error}): {text}") from None


def json_object(text: str, option: str) -> dict[str, Any]:
    value = _json(text, option)
    if not isinstance(value, dict):
        raise UsageError(f"{option} must be a JSON object, like {EXAMPLE_CRITERIA}: {text}")
    return value
