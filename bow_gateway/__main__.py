"""``python -m bow_gateway``: the same as the ``bow-gateway`` command."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
