"""The outbound's protocols besides Socket.IO (which is the core,
:mod:`bow_gateway.outbound.sockets`): Server-Sent Events, Flywheel's and Gobbler's WebSocket
protocols. They build on the outbound's core, which never imports them."""
