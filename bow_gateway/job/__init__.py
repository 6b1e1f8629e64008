"""The Spark criteria job (``bow-gateway criteria-job``): every listener's criteria, precomputed.

:mod:`.run` runs it (its command line is :mod:`.command`), :mod:`.config` reads its TOML file,
:mod:`.frame` turns the query's rows into Redis commands in Spark SQL, :mod:`.checks` checks them
before anything is written, :mod:`.writer` sends them from the executors (:mod:`.writing` runs
the writers and keeps the state of incremental runs), :mod:`.store` keeps the snapshots, the lock
and the switch. The Redis layout it writes
is :mod:`bow_gateway.core.criteria_snapshot`, which the gateway's middleware reads. Importing this
package imports neither PySpark nor redis-py.
"""
