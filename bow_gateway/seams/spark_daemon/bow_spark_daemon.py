"""PySpark's daemon for the criteria job's local runs: imports what every worker needs once.

PySpark's daemon (``pyspark.daemon``) forks a Python worker per task slot, and each worker then
imports ``pyspark.worker`` and what it needs from ``pyspark.zip``, first on its path: a zip's
modules are compiled at every import (~1.5 s of CPU per worker), and ``importlib.invalidate_caches``
(each task's set-up) re-reads the zip's directory. This daemon, named by the job's
``spark.python.daemon.module`` in local mode only (where the executors run the driver's own
Python and PySpark), imports PySpark from its installed package (compiled once, cached) rather
than from the zips, and imports the worker module and redis-py before it forks, so that every
worker starts with them. Modules that start threads when imported (pyarrow, pandas) are not
imported here: a fork copies no thread (PySpark imports the worker after the fork for that
reason; ``pyspark.worker`` itself starts none, checked by the test of this module).

A top-level module in a folder of its own, so that putting the folder on the workers' path
shadows nothing; it reaches into PySpark's private ``pyspark.daemon.manager``.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys


def prefer_installed_pyspark() -> bool:
    """Take ``pyspark.zip`` and ``py4j-*.zip`` off the path when the same packages are installed
    (then imported with their cached bytecode); whether it did."""
    zips = [
        path
        for path in sys.path
        if path.endswith(".zip") and os.path.basename(path).startswith(("pyspark", "py4j"))
    ]
    rest = [path for path in sys.path if path not in zips]
    if not zips or any(
        importlib.machinery.PathFinder.find_spec(name, rest) is None for name in ("pyspark", "py4j")
    ):
        return False
    sys.path[:] = rest
    for path in zips:
        sys.path_importer_cache.pop(path, None)
    return True


def main() -> None:
    prefer_installed_pyspark()
    try:
        import pyspark.worker  # noqa: F401  - what each worker imports first, once here
        import redis  # noqa: F401  - the criteria job's writers' client
    except ImportError:  # the workers will fail, saying what this Python lacks
        pass
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
