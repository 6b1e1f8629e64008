#!/bin/sh
# Build the wheel and install it, not editable, with the test tools, into a fresh virtual
# environment, so that the suite runs against what users install. The suite never imports the
# tree's bow_gateway/: pytest runs in importlib mode (setup.cfg) and tests/conftest.py keeps the
# working directory off the path of every Python the tests start (PYTHONSAFEPATH).
#
#   sh tests/install-wheel.sh VENV [pip install options...]
#
# The README's test command makes .venv with the newest versions setup.cfg admits;
# tests/lowest-versions.sh makes .venv-lowest with `-c tests/lowest-versions.txt`.
set -eu
cd "$(dirname "$0")/.."
venv=$1
shift
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
# setuptools reuses build/ between builds: a module deleted from the tree would stay in the wheel.
rm -rf build "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" wheel -q --no-deps -w "$wheels" .
"$venv/bin/pip" install -q "$@" "$(ls "$wheels"/bow_gateway-*.whl)[test]"
"$venv/bin/pip" check
