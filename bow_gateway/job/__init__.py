"""The Spark criteria job (``bow-gateway criteria-job``): every listener's criteria, precomputed.

:mod:`.run` runs it (and its command line), :mod:`.config` reads its TOML file, :mod:`.frame`
turns the query's rows into Redis commands in Spark SQL, :mod:`.writer` sends them from the
executors, :mod:`.store` keeps the snapshots, the lock and the switch. The Redis layout it writes
is :mod:`bow_gateway.criteria_snapshot`, which the gateway's middleware reads. Importing this
package imports neither PySpark nor redis-py.
"""
