"""The JWT outbound: a signed token becomes listener details (``id`` and the token's claims).

HS256 (and HS384/HS512) with a shared secret, or RS256/ES256 (and kin) with a public key; the
algorithms are pinned by configuration, never read from the token. ``exp`` and ``nbf`` are checked
when present (an expired token raises :class:`~bow_gateway.core.codes.TokenExpired`, a
``ValueError`` the gateway refuses with 4003), ``aud`` and ``iss`` when configured. A token's
``exp`` is also copied into the listener details as ``exp`` (whole seconds since the Unix epoch,
plus the ``leeway``): when the gateway asks a protocol-2 socket to re-authenticate. A shared secret
shorter than its algorithm's hash is refused (RFC 7518, section 3.2): 32 bytes for HS256, 48 for
HS384, 64 for HS512.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jwt

from bow_gateway.core.codes import TokenExpired

_HMAC = {"HS256", "HS384", "HS512"}
# RFC 7518, section 3.2: "a key of the same size as the hash output ... or larger MUST be used".
MIN_SECRET_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
_PUBLIC = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}


class JwtOutbound:
    """``create_listener_details_from_token`` for signed JWTs.

    The key comes from the arguments or from an environment variable (``secret_env``,
    ``public_key_env``), so that it need not be written in a config file.
    """

    def __init__(
        self,
        *,
        algorithms: Sequence[str] = ("HS256",),
        secret: str | None = None,
        secret_env: str | None = None,
        public_key: str | None = None,
        public_key_env: str | None = None,
        public_key_file: str | None = None,
        audience: str | Sequence[str] | None = None,
        issuer: str | None = None,
        id_claim: str = "sub",
        leeway: float = 0.0,
        require: Sequence[str] = (),
    ) -> None:
        algorithms = list(algorithms)
        if not algorithms:
            raise ValueError("algorithms must name at least one algorithm")
        unknown = set(algorithms) - _HMAC - _PUBLIC
        if unknown:
            raise ValueError(f"algorithms: unsupported {sorted(unknown)}")
        if set(algorithms) & _HMAC and set(algorithms) & _PUBLIC:
            raise ValueError(
                "algorithms must not mix shared-secret (HS*) and public-key algorithms"
            )
        if set(algorithms) <= _HMAC:
            key: str | None = secret if secret is not None else _from_env(secret_env, "secret")
            if key:
                check_secret(key, algorithms, f"${secret_env}" if secret is None else "")
        else:
            key = public_key
            if key is None and public_key_file is not None:
                with open(public_key_file, encoding="utf-8") as file:
                    key = file.read()
            if key is None:
                key = _from_env(public_key_env, "public_key")
        if not key:
            raise ValueError("the key is empty")
        self._key = key
        self._algorithms = algorithms
        self._audience = list(audience) if isinstance(audience, (list, tuple)) else audience
        self._issuer = issuer
        self._id_claim = id_claim
        self._leeway = leeway
        self._require = list(require)

    def __call__(self, token: Any) -> dict[str, Any]:
        if not isinstance(token, str):
            raise ValueError(f"the token must be a string, not {type(token).__name__}")
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=self._algorithms,
                audience=self._audience,
                issuer=self._issuer,
                leeway=self._leeway,
                options={"require": self._require, "verify_aud": self._audience is not None},
            )
        except jwt.ExpiredSignatureError as error:  # 4003 token_expired, not 4002
            raise TokenExpired(f"invalid token: {error}") from None
        except jwt.PyJWTError as error:
            raise ValueError(f"invalid token: {error}") from None
        if self._id_claim not in claims:
            raise ValueError(f"the token has no {self._id_claim!r} claim")
        details: dict[str, Any] = {"id": claims[self._id_claim], "claims": claims}
        if claims.get("exp") is not None:
            # PyJWT checked that int() takes it (a float or a numeric string passes); the details
            # hold an int. The leeway this outbound grants (clock skew) delays the expiry with it,
            # or the gateway would refuse as expired a token this outbound has just accepted.
            details["exp"] = int(claims["exp"]) + int(self._leeway)
        return details

    def __repr__(self) -> str:  # never shows the key
        return f"JwtOutbound(algorithms={self._algorithms!r}, id_claim={self._id_claim!r})"


def _from_env(variable: str | None, what: str) -> str:
    if variable is None:
        raise ValueError(f"give {what} or {what}_env")
    value = os.environ.get(variable)
    if not value:
        raise ValueError(f"the environment variable {variable} ({what}) is not set")
    return value


def check_secret(secret: str, algorithms: Sequence[str] = ("HS256",), source: str = "") -> None:
    """Refuse a shared secret shorter than RFC 7518 allows for the strongest of ``algorithms``
    (``ValueError``, naming ``source`` if given): a short HMAC key can be found by brute force
    from a single token."""
    needed = max(MIN_SECRET_BYTES.get(algorithm, 0) for algorithm in algorithms)
    size = len(secret.encode())
    if size < needed:
        strongest = max(algorithms, key=lambda algorithm: MIN_SECRET_BYTES.get(algorithm, 0))
        named = f" ({source})" if source else ""
        raise ValueError(
            f"the {strongest} secret{named} is {size} bytes: RFC 7518 (section 3.2) requires "
            f"at least {needed} for {strongest}; make one with "
            f"python3 -c 'import secrets; print(secrets.token_urlsafe({needed}))'"
        )


def mint(
    listener_id: str,
    secret: str,
    *,
    criteria: Mapping[str, Any] | None = None,
    ttl: float = 3600,
    algorithm: str = "HS256",
    extra: Mapping[str, Any] | None = None,
) -> str:
    """A token for trying things out: ``sub`` is the listener id, ``criteria`` a claim."""
    if algorithm in MIN_SECRET_BYTES:
        check_secret(secret, [algorithm])
    now = int(time.time())
    claims: dict[str, Any] = {"sub": listener_id, "iat": now, "exp": now + int(ttl)}
    if criteria is not None:
        claims["criteria"] = dict(criteria)
    claims.update(extra or {})
    return jwt.encode(claims, secret, algorithm=algorithm)
