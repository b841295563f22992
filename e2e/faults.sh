#!/usr/bin/env bash
# Fault scenarios under load (e2e/tests/faults.rs: killed, hung Consul,
# restart, NACK, rolling restart; e2e/tests/registry_faults.rs: partitioned
# in a network namespace, hung ZooKeeper and rnacos) with full-length faults:
# each fault lasts $1 seconds (default 60; CI runs them with 10 as part of
# e2e/test.sh). Prints one FIGURES line per scenario; exits non-zero if any
# scenario failed. RELIABILITY.md records the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
export MESHBRIDGE_CACHE="${MESHBRIDGE_CACHE:-$HOME/.cache/meshbridge}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$MESHBRIDGE_CACHE/target}"
# shellcheck source=e2e/env.sh
source e2e/env.sh consul envoy zookeeper rnacos
export MESHBRIDGE_FAULT_SECS="${1:-60}"
log="$(mktemp)"
set +e
cargo test -p meshbridge-e2e --test faults --test registry_faults -- --nocapture --test-threads=1 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
echo "== figures (faults of ${MESHBRIDGE_FAULT_SECS}s)"
grep -o 'FIGURES.*' "$log" || true
exit "$status"
