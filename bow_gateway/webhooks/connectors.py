"""Connectors: destinations of the webhook engine other than an HTTP webhook (section 20's Web
Push, :mod:`bow_gateway.connectors.webpush`). The engine stores, orders, leases, dead-letters and
replays their events exactly as a webhook's; only the delivery is theirs: :meth:`Connector.deliver`
sends one event, retrying as it sees fit, and says how it ended."""

from __future__ import annotations

from typing import Protocol

from .events import WebhookEvent
from .sender import Outcome


class Connector(Protocol):
    """What the engine needs of a connector. ``tag`` names it (the end of its events'
    ``webhook-id``s, a dead letter's destination, the ``webhook`` label of the metrics): stable
    across restarts; ``shown_url`` is what a dead letter shows as its ``url``."""

    @property
    def tag(self) -> str: ...

    @property
    def events(self) -> frozenset[str]: ...

    @property
    def shown_url(self) -> str: ...

    async def start(self) -> None:
        """Ready to deliver (its HTTP session made)."""
        ...

    async def close(self) -> None:
        """Nothing more delivered; its connections closed."""
        ...

    async def deliver(self, webhook_id: str, event: WebhookEvent) -> Outcome:
        """Deliver ``event`` (the same ``webhook_id`` across retries, takeovers and replays):
        delivered, or a dead letter with the last status and error."""
        ...
