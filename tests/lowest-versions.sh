#!/bin/sh
# The suite against the lowest versions setup.cfg admits (tests/lowest-versions.txt), installed
# from the wheel in a virtual environment of its own (.venv-lowest), so that a floor that admits a
# broken version fails CI. The Spark job's tests are left out: they exercise pyspark, not these
# floors.
#
#   sh tests/lowest-versions.sh
set -eu
cd "$(dirname "$0")/.."
sh tests/install-wheel.sh .venv-lowest -c tests/lowest-versions.txt
exec .venv-lowest/bin/pytest -q -p no:cacheprovider --ignore-glob="tests/test_criteria_job*" "$@"
