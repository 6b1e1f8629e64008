"""What the benchmark scripts of ``bench/`` share (not a test package, not part of bow_gateway).

The scripts run as ``.venv/bin/python bench/<script>.py`` from the repository's root, so that
``bench/`` is ``sys.path[0]`` and this package is ``lib``: a script imports from ``lib``, never
from another script, and nothing in ``lib`` imports a script. ``lib/gateway.py`` is also run by
path, as the gateway process most benchmarks start: it imports nothing of ``lib``.
"""

from __future__ import annotations

from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
"""``bench/``: where the scripts are."""
ROOT = BENCH.parent
"""The repository's root (``git_state``, ``serve --workers``' working directory)."""
