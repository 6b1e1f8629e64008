"""Bundled inbounds: how an HTTP request body becomes a message. Use them as they are, or copy one."""
