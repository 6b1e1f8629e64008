"""Bundled middlewares: how listener details become criteria. Use them as they are, or copy one."""
