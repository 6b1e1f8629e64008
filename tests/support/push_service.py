"""A Web Push service for the tests: a real aiohttp server on a free port that, like a browser
vendor's, checks each push's VAPID header (RFC 8292: an ES256 JWT verified against ``k``, its
``aud`` the endpoint's origin, its ``exp`` ahead and within 24 h, its ``sub`` the subject),
decrypts the body (RFC 8291, aes128gcm) with the keys a browser made for the subscription, records
the plaintext, and answers as the test says (``201`` by default)."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import http_ece  # type: ignore[import-untyped]
import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from .redis_server import free_port

Answer = tuple[int, dict[str, str]]
Answering = Callable[[str, int], Answer]
"""``answer(token, attempt)``: the status and headers of the ``attempt``-th push (from 1) to the
subscription ``token``."""


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Browser:
    """What a browser keeps of one subscription: its ECDH key pair and auth secret."""

    token: str
    private_key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    auth: bytes = field(default_factory=lambda: secrets.token_bytes(16))

    def keys(self) -> dict[str, str]:
        public = self.private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return {"p256dh": b64url(public), "auth": b64url(self.auth)}


@dataclass
class Pushed:
    """A push that verified and decrypted: its subscription's token, plaintext, headers."""

    token: str
    message: dict[str, Any]
    headers: dict[str, str]


@dataclass
class PushService:
    """``subject``: the VAPID ``sub`` every push must carry. ``refused`` lists why requests were
    refused (a test expects none); ``attempts`` counts each subscription's requests."""

    subject: str
    server_key: str = ""
    """The application server key the subscriptions were made with: ``k`` must be it."""
    answer: Answering = lambda token, attempt: (201, {})
    port: int = field(default_factory=free_port)
    browsers: dict[str, Browser] = field(default_factory=dict)
    pushed: list[Pushed] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    _runner: web.AppRunner | None = None

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def subscribe(self) -> dict[str, Any]:
        """A new subscription, as ``PushSubscription.toJSON()`` gives it to a page."""
        browser = Browser(secrets.token_urlsafe(12))
        self.browsers[browser.token] = browser
        endpoint = f"{self.origin}/push/{browser.token}"
        return {"endpoint": endpoint, "expirationTime": None, "keys": browser.keys()}

    async def start(self) -> PushService:
        app = web.Application()
        app.router.add_post("/push/{token}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def to(self, subscription: dict[str, Any]) -> list[dict[str, Any]]:
        """The messages pushed to ``subscription``."""
        token = subscription["endpoint"].rsplit("/", 1)[1]
        return [pushed.message for pushed in self.pushed if pushed.token == token]

    async def wait_for(self, count: int, timeout: float = 15.0) -> None:
        """Until ``count`` pushes verified and decrypted."""
        deadline = time.monotonic() + timeout
        while len(self.pushed) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.pushed)} pushes, not {count}: {self.refused}")
            await asyncio.sleep(0.02)

    async def _handle(self, request: web.Request) -> web.Response:
        token = request.match_info["token"]
        browser = self.browsers.get(token)
        if browser is None:
            return web.Response(status=404)
        body = await request.read()
        problem = self._check_headers(request)
        if problem:
            self.refused.append(problem)
            return web.Response(status=401 if "vapid" in problem else 400, text=problem)
        attempt = self.attempts[token] = self.attempts.get(token, 0) + 1
        status, headers = self.answer(token, attempt)
        if 200 <= status < 300:
            plaintext = http_ece.decrypt(
                body,
                private_key=browser.private_key,
                auth_secret=browser.auth,
                version="aes128gcm",
            )
            self.pushed.append(Pushed(token, json.loads(plaintext), dict(request.headers)))
        return web.Response(status=status, headers=headers)

    def _check_headers(self, request: web.Request) -> str:
        """Why the request is refused, or ``""``."""
        if request.headers.get("Content-Encoding") != "aes128gcm":
            return "Content-Encoding is not aes128gcm"
        if not request.headers.get("TTL", "").isdigit():
            return "no TTL"
        return self._check_vapid(request.headers.get("Authorization", ""))

    def _check_vapid(self, authorization: str) -> str:
        scheme, _, rest = authorization.partition(" ")
        params = dict(part.strip().split("=", 1) for part in rest.split(",") if "=" in part)
        if scheme != "vapid" or set(params) != {"t", "k"}:
            return f"vapid: not 'vapid t=..., k=...': {authorization[:40]!r}"
        if self.server_key and params["k"] != self.server_key:
            return "vapid: k is not the key the subscription was made with"
        try:
            key = ec.EllipticCurvePublicKey.from_encoded_point(
                ec.SECP256R1(), unb64url(params["k"])
            )
            claims = jwt.decode(
                params["t"],
                key,
                algorithms=["ES256"],
                audience=self.origin,
                options={"require": ["aud", "exp", "sub"]},
            )
        except (ValueError, jwt.PyJWTError) as error:
            return f"vapid: {type(error).__name__}: {error}"
        if not time.time() < claims["exp"] <= time.time() + 24 * 3600:
            return "vapid: exp not within the next 24 h"
        if claims["sub"] != self.subject:
            return f"vapid: sub {claims['sub']!r} is not {self.subject!r}"
        return ""
