"""Bundled inbounds: how a request body, or a whole request, becomes a message. Use them as they
are, or copy one."""
