"""What a client protocol's endpoint may use of the outbound's core: :class:`Hub`. The core
(:class:`~.sockets.SocketOutbound`) is one; an endpoint never needs to know which, nor that it
also serves Socket.IO."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ..core.plugins import OutboundPlugin
from .admission import Admission
from .parts import Sockets
from .publishing import ClientPublish
from .topic_replay import TopicHistory


class Hub(Sockets, Protocol):
    """The core, as every protocol's endpoint sees it: the connections and their parts
    (:class:`~.parts.Sockets`), admission, client publishing, topic history."""

    admission: Admission
    client_publish: ClientPublish | None
    topic_history: TopicHistory | None
    open_connections: int

    @property
    def outbounds(self) -> Mapping[str, OutboundPlugin]:
        """The outbounds served, by normalised version."""
        ...
