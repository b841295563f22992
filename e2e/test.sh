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

# The workspace's lint and test builds need none of the installs, so they
# run beside them: the installs leave CPU idle while they download, link
# and wait on each other, and a cold run (nothing cached) spends about a
# quarter of an hour in these builds. Their output is shown when they end.
mkdir -p "$MESHBRIDGE_CACHE"
build_log="$MESHBRIDGE_CACHE/last-build.log"
(
  cargo clippy --workspace --all-targets --locked -- -D warnings &&
    cargo test --workspace --locked --no-run --lib --bins --tests
) > "$build_log" 2>&1 &
build_pid=$!
trap 'pkill -P "$build_pid" 2>/dev/null; kill "$build_pid" 2>/dev/null || true' EXIT

# shellcheck source=e2e/env.sh
source e2e/env.sh consul envoy rnacos nacos-server zookeeper tinyproxy eureka-server eureka-client dubbo-provider spring-app docker-compose kubetools cargo-deny mdbook kube-apiserver helm istiod istiod-1.27 chromium

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

echo "== helm chart"
# The chart with its default values and with every value changed
# (e2e/fixtures/helm-values-all.yaml); e2e/tests/helm.rs compares it with
# the kustomization and installs it on a real API server.
if [ -n "${MESHBRIDGE_HELM_BIN:-}" ] && [ -n "${MESHBRIDGE_KUBE_VALIDATE_BIN:-}" ]; then
  chart=deploy/helm/meshbridge values_all=e2e/fixtures/helm-values-all.yaml
  export HELM_CACHE_HOME="$MESHBRIDGE_CACHE/helm-home/cache" HELM_CONFIG_HOME="$MESHBRIDGE_CACHE/helm-home/config" \
    HELM_DATA_HOME="$MESHBRIDGE_CACHE/helm-home/data"
  "$MESHBRIDGE_HELM_BIN" lint --strict "$chart"
  "$MESHBRIDGE_HELM_BIN" lint --strict "$chart" -f "$values_all"
  for v in default all; do
    args=(); [ "$v" = all ] && args=(-f "$values_all")
    "$MESHBRIDGE_HELM_BIN" template meshbridge "$chart" -n meshbridge-system --include-crds "${args[@]}" \
      > "$MESHBRIDGE_CACHE/helm-rendered-$v.yaml"
  done
  # McpBridge has no schema there (a WARN); tests/helm.rs stores it on a
  # real API server under the chart's CRD.
  "$MESHBRIDGE_KUBE_VALIDATE_BIN" --strict --quiet "$MESHBRIDGE_CACHE"/helm-rendered-{default,all}.yaml
  echo "rendered and validated: $(grep -c '^kind:' "$MESHBRIDGE_CACHE/helm-rendered-default.yaml") objects (default values)"
else
  echo "helm / kubernetes-validate not installed (e2e/setup.sh helm kubetools): helm chart check FAILED"
  manifests_failed=1
fi

echo "== docker-compose config"
"$MESHBRIDGE_DOCKER_COMPOSE_BIN" -f docker-compose.yml config -q
echo "== envoy --mode validate"
e2e/validate-envoy.sh
echo "== mdbook build docs (links: tests/docs_links.rs)"
book=$(mktemp -d)
"$MESHBRIDGE_MDBOOK_BIN" build docs --dest-dir "$book"
test -s "$book/index.html" || { echo "mdbook build docs: no index.html: FAILED"; exit 1; }
echo "built $(find "$book" -name '*.html' | wc -l) pages"
rm -rf "$book"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy, and the test build (begun beside the installs)"
t0=$SECONDS
build_status=0
wait "$build_pid" || build_status=$?
trap - EXIT
grep -v '^\s*\(Compiling\|Checking\|Blocking\) ' "$build_log" || true
echo "(waited $((SECONDS - t0)) s for the builds)"
[ "$build_status" = 0 ] || { echo "cargo clippy or the test build FAILED (full log: $build_log)"; exit 1; }
echo "== cargo deny (licenses, bans, sources; advisories need a database we cannot fetch here)"
# cargo-deny runs `cargo metadata` offline, which needs every locked crate,
# including those only other platforms build (a fresh machine's builds
# fetched only this one's): fetch them first (a no-op once cached).
cargo fetch --locked --quiet
# Duplicate versions are warnings (deny.toml); a license or source problem fails.
"$MESHBRIDGE_CARGO_DENY_BIN" deny --offline check --hide-inclusion-graph licenses bans sources
# The test binaries, built above, run two at a time (MESHBRIDGE_TEST_JOBS):
# they mostly wait on the servers they start, so one at a time leaves a
# core idle. e2e/run-tests.py runs them as cargo test would, longest first,
# and prints each one's output whole when it ends.
jobs="${MESHBRIDGE_TEST_JOBS:-2}"
echo "== cargo test ($jobs test binaries at a time: e2e/run-tests.py)"
log="$MESHBRIDGE_CACHE/last-test.log"
binaries="$MESHBRIDGE_CACHE/test-binaries.json"
cargo test --workspace --locked --no-run --lib --bins --tests --message-format=json > "$binaries"
set +e
e2e/run-tests.py --jobs "$jobs" --durations e2e/test-durations.tsv \
  --durations-out "$MESHBRIDGE_CACHE/last-test-durations.tsv" -- --nocapture < "$binaries" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
echo "== figures"
grep -h '^FIGURE' "$log" || true
# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
[ "${manifests_failed:-0}" = 1 ] && status=1
exit "$status"
