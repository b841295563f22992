#!/usr/bin/env bash
# Checks every Envoy bootstrap in the repository with `envoy --mode validate`
# (Envoy 1.40, as installed by e2e/setup.sh). A bootstrap is any YAML file
# with a top-level `static_resources:` or `dynamic_resources:`.
#
#   e2e/validate-envoy.sh            (after `source e2e/env.sh envoy`)
set -euo pipefail
cd "$(dirname "$0")/.."
envoy="${MESHBRIDGE_ENVOY_BIN:?set MESHBRIDGE_ENVOY_BIN (source e2e/env.sh envoy)}"

mapfile -t files < <(grep -rlE --include='*.yaml' --include='*.yml' \
  --exclude-dir=target --exclude-dir=.git '^(static_resources|dynamic_resources):' . | sort)
[ ${#files[@]} -gt 0 ] || { echo "no Envoy bootstrap found" >&2; exit 1; }
for f in "${files[@]}"; do
  if out=$("$envoy" --mode validate -c "$f" -l warning 2>&1); then
    echo "ok   $f"
  else
    echo "FAIL $f" >&2
    echo "$out" | tail -n 20 >&2
    exit 1
  fi
done
