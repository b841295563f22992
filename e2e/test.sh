#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs the real servers
# the tests use (cached; see e2e/setup.sh), then runs format and lint checks
# and every test in the workspace. Tests start and stop their own servers on
# free ports, so nothing needs to be running beforehand.
set -euo pipefail
cd "$(dirname "$0")/.."

export MESHBRIDGE_CACHE="${MESHBRIDGE_CACHE:-$HOME/.cache/meshbridge}"
# Outside the work tree, so a fresh clone (CI) still builds incrementally.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$MESHBRIDGE_CACHE/target}"

# shellcheck source=e2e/env.sh
source e2e/env.sh consul envoy rnacos zookeeper tinyproxy eureka-server eureka-client docker-compose kubetools cargo-deny kube-apiserver istiod

echo "== kubernetes manifests"
if [ -n "${MESHBRIDGE_KUBECTL_BIN:-}" ] && [ -n "${MESHBRIDGE_KUBE_VALIDATE_BIN:-}" ]; then
  rendered="$MESHBRIDGE_CACHE/kustomize-rendered.yaml"
  "$MESHBRIDGE_KUBECTL_BIN" kustomize deploy/kubernetes > "$rendered"
  "$MESHBRIDGE_KUBE_VALIDATE_BIN" --strict --quiet "$rendered" deploy/kubernetes/crd-mcpbridge.yaml \
    deploy/examples/dubbo-spring/*.yaml
  echo "rendered and validated: $(grep -c '^kind:' "$rendered") objects"
else
  echo "kubectl / kubernetes-validate not installed (e2e/setup.sh kubetools): manifest check FAILED"
  manifests_failed=1
fi

echo "== docker-compose config"
"$MESHBRIDGE_DOCKER_COMPOSE_BIN" -f docker-compose.yml config -q
echo "== envoy --mode validate"
e2e/validate-envoy.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo deny (licenses, bans, sources; advisories need a database we cannot fetch here)"
# cargo-deny runs `cargo metadata` offline, which needs every locked crate,
# including those only other platforms build (a fresh machine's builds
# fetched only this one's): fetch them first (a no-op once cached).
cargo fetch --locked --quiet
# Duplicate versions are warnings (deny.toml); a license or source problem fails.
"$MESHBRIDGE_CARGO_DENY_BIN" deny --offline check --hide-inclusion-graph licenses bans sources
echo "== cargo test"
log="$MESHBRIDGE_CACHE/last-test.log"
set +e
cargo test --workspace --locked --no-fail-fast --lib --bins --tests -- --nocapture 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
echo "== figures"
grep -h '^FIGURE' "$log" || true
# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
[ "${manifests_failed:-0}" = 1 ] && status=1
exit "$status"
