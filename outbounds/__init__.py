"""Bundled outbounds: how a socket's token becomes listener details. Use them as they are, or copy one."""
