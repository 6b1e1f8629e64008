"""The criteria job as a file, for ``spark-submit`` (which runs a path, not a module)::

    spark-submit --jars /usr/share/java/postgresql.jar \\
        "$(python -c 'import bow_gateway.criteria_job as m; print(m.__file__)')" --config job.toml

Also ``python -m bow_gateway.criteria_job``; the job itself is :mod:`bow_gateway.job`.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # Run as a file, its folder is sys.path[0]: the gateway's own modules (config, logs, ...)
    # would shadow top-level modules of those names. Hence also the absolute import below.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]

    from bow_gateway.job.command import main

    sys.exit(main())
