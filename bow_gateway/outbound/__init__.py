"""The Socket.IO outbound: :mod:`.sockets` (connections and delivery), :mod:`.authentication`
(tokens, re-authentication, expiry, recovery), :mod:`.writer` (writing to one connection),
:mod:`.codec` (the packets of protocols 1 and 2), :mod:`.connection` (one connection's state)."""

from .connection import Connection, Settings
from .sockets import SocketOutbound, normalise_version

__all__ = ["Connection", "Settings", "SocketOutbound", "normalise_version"]
