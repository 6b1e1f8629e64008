"""The backplane interface: how events reach every instance of one gateway, all in one order.

Every backend (:mod:`.memory`, :mod:`.redis`) implements :class:`Backplane`, and refuses what it
cannot take with :class:`BackplaneUnavailable`, which the inbound answers with ``503``.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator


class BackplaneUnavailable(Exception):
    """The backplane cannot take an event now; the inbound answers 503 with ``Retry-After``."""

    def __init__(self, reason: str, retry_after: float = 1.0) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class Backplane(abc.ABC):
    """Carries opaque events from any instance to every instance, in one order."""

    @abc.abstractmethod
    async def connect(self) -> None:
        """Get ready to publish; :meth:`events` yields what is published from now on."""

    @abc.abstractmethod
    async def disconnect(self) -> None:
        """Stop: :meth:`events` ends, :meth:`publish` refuses."""

    @abc.abstractmethod
    async def publish(self, data: bytes) -> None:
        """Hand ``data`` over for delivery, or raise :class:`BackplaneUnavailable`.

        Once this returns, the event is not lost: every instance's :meth:`events` yields it.
        """

    @abc.abstractmethod
    def events(self) -> AsyncIterator[bytes]:
        """Every event published by any instance, in one order, until :meth:`disconnect`."""

    @property
    @abc.abstractmethod
    def ready(self) -> bool:
        """Whether :meth:`publish` can take events now (``GET /health`` says 503 when not)."""
