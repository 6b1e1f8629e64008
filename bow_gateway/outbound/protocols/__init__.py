"""The outbound's protocols besides Socket.IO (which is the core,
:mod:`bow_gateway.outbound.sockets`): Flywheel's WebSocket protocol, Server-Sent Events, Gobbler's
WebSocket protocol, each registered (:mod:`.registry`) as its module is imported. They build on
the outbound's core, which never imports them."""

from ..registry import ClientProtocol, registered
from . import flywheel, gobbler, sse

__all__ = ["ClientProtocol", "flywheel", "gobbler", "registered", "sse"]
