"""Standard Webhooks signatures (standardwebhooks.com): ``webhook-signature: v1,<base64 of
HMAC-SHA256 over "{id}.{timestamp}.{body}">``, keyed with the secret's decoded bytes. Made by hand
(a few lines); the tests check every request with the ``standardwebhooks`` library."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time


def signed_headers(
    key: bytes, webhook_id: str, body: bytes, now: float | None = None
) -> dict[str, str]:
    """The headers of one attempt: ``webhook-id``, ``webhook-timestamp`` (now, so that a late
    retry is still within a verifier's tolerance) and ``webhook-signature``."""
    timestamp = str(int(time.time() if now is None else now))
    signed = b"%s.%s.%s" % (webhook_id.encode(), timestamp.encode(), body)
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }
