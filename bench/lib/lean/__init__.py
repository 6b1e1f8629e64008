"""Lean clients of the gateway, on asyncio Protocols (no python-socketio: it costs a few µs per
received frame): Socket.IO over a websocket (``websocket.LeanClient``), Flywheel, SSE, and a
keep-alive HTTP/1.1 client of the inbound (``posters``). Every receipt of a benchmark message is
counted in the ``books.Books`` the clients of a process share."""
