"""Bundled inbounds: how a request body becomes a message. Use them as they are, or copy one."""
