#!/bin/sh
# Install the Debian packages the test suite needs, when they are missing; otherwise do nothing.
#
#   redis-server  the Redis tests start their own redis-server processes (tests/support/redis_server.py)
#   nginx         tests/test_deploy.py runs deploy/nginx/bow-gateway.conf in front of two gateways
#   openjdk-17-jre-headless  tests/test_criteria_job.py runs the Spark criteria job (PySpark
#                 needs Java 17+)
#   libpostgresql-jdbc-java  the PostgreSQL JDBC driver (/usr/share/java/postgresql.jar) that
#                 the criteria job reads PostgreSQL with, in tests/test_criteria_job.py
#   chromium chromium-driver  tests/test_cors.py drives headless Chromium with chromedriver to
#                 check cross-origin access from a real browser
#   nodejs npm    tests/test_official_client.py runs the official socket.io-client (its npm ci
#                 installs it into tests/node/); NodeSource's nodejs, which bundles npm and
#                 conflicts with Debian's npm package, will do as well
#
# Idempotent: a package already installed is left alone, and `apt-get update` runs only when
# something must be installed. Root is needed only then: a non-root user with something missing
# gets exit status 1 and the list of what to install. Usage:
#
#   sh tests/install-system-packages.sh && python3 -m venv .venv && ...
set -eu

PACKAGES="redis-server nginx openjdk-17-jre-headless libpostgresql-jdbc-java chromium chromium-driver nodejs npm curl"

installed() {
    # dpkg-query prints "install ok installed" for a package that is fully installed.
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ] && return 0
    # NodeSource's nodejs provides npm (and conflicts with Debian's): an npm on the PATH will do.
    [ "$1" = npm ] && command -v npm >/dev/null 2>&1
}

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "install-system-packages.sh: not a Debian system (no dpkg-query); install these" \
        "yourself: $PACKAGES" >&2
    exit 1
fi

missing=""
for package in $PACKAGES; do
    installed "$package" || missing="$missing $package"
done
missing="${missing# }"

if [ -z "$missing" ]; then
    echo "install-system-packages.sh: already installed: $PACKAGES"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-system-packages.sh: missing Debian packages: $missing" >&2
    echo "install-system-packages.sh: run this script as root, or: sudo apt-get install $missing" >&2
    exit 1
fi

echo "install-system-packages.sh: installing: $missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update
# shellcheck disable=SC2086 # one word per package
apt-get install -y --no-install-recommends $missing

# Debian's nginx package starts a system nginx on port 80 (and redis-server one on 6379) where
# there is an init system; the tests never use them: they start their own on free ports.
for package in $missing; do
    if ! installed "$package"; then
        echo "install-system-packages.sh: $package did not install" >&2
        exit 1
    fi
done
echo "install-system-packages.sh: installed: $missing"
