"""The embedded default's names and numbers: what the command line shows and uses without
importing the gateway (``bow-gateway push`` or ``criteria-job`` start without the server)."""

from __future__ import annotations

from typing import Final

DEV_JWT_SECRET: Final = "bow-gateway-development-secret-change-me"
"""The embedded default's JWT secret when ``BOW_JWT_SECRET`` is not set: documented, so public."""
DEV_INBOUND_PASSWORD: Final = "change-me"
"""The embedded default's inbound password when ``BOW_INBOUND_PASSWORD`` is not set."""
DOCUMENTED_SECRETS: Final = frozenset(
    {DEV_JWT_SECRET, DEV_INBOUND_PASSWORD, "CHANGE-ME", "CHANGE-ME-TO-AT-LEAST-32-RANDOM-BYTES"}
)
"""Secrets anyone can read in this project: the embedded default's, deploy/'s placeholders."""
JWT_SECRET_ENV: Final = "BOW_JWT_SECRET"
CONFIG_ENV: Final = "BOW_CONFIG"

DEFAULT_PORT: Final = 8080
DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_USERNAME: Final = "pusher"
DEFAULT_INBOUND_PATH: Final = "/v1/messages"
DEFAULT_VERSION: Final = "v1"
