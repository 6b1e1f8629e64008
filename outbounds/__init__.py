"""Bundled outbounds: how a token becomes listener details. Use them as they are, or copy one."""
