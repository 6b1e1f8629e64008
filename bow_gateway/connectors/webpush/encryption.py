"""A push's body encrypted for one subscription (RFC 8291, ``aes128gcm`` of RFC 8188), with
``http_ece`` (which the ``webpush`` extra brings with pywebpush): a fresh ephemeral key and salt
per push, as pywebpush's ``WebPusher.encode`` does."""

from __future__ import annotations

import os
from typing import Final

from cryptography.hazmat.primitives.asymmetric import ec

from .subscription import Subscription, decoded_key

MAX_RECORD: Final = 4_096
"""Bytes of an encrypted body a push service must take (RFC 8030 section 7.2)."""
OVERHEAD: Final = 86 + 16 + 1
"""aes128gcm's header (salt, record size, key id: the 65-byte key), the tag, the delimiter."""
MAX_PLAINTEXT: Final = MAX_RECORD - OVERHEAD
"""Bytes of a push's plaintext that fit in one record (3,993)."""


def encrypted(plaintext: bytes, subscription: Subscription) -> bytes:
    """``plaintext`` (at most :data:`MAX_PLAINTEXT` bytes) encrypted for ``subscription``."""
    import http_ece  # type: ignore[import-untyped]  # the webpush extra, checked at start

    if len(plaintext) > MAX_PLAINTEXT:
        raise ValueError(f"a push carries at most {MAX_PLAINTEXT} bytes, not {len(plaintext)}")
    body: bytes = http_ece.encrypt(
        plaintext,
        salt=os.urandom(16),
        private_key=ec.generate_private_key(ec.SECP256R1()),
        dh=decoded_key(subscription.p256dh),
        auth_secret=decoded_key(subscription.auth),
        version="aes128gcm",
    )
    return body
