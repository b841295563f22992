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
# Bootstraps naming certificate files under /etc/envoy/xds/ (the mTLS
# example) are checked on a copy pointing at a throwaway certificate, since
# validation reads the files.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=validate \
  -keyout "$tmp/tls.key" -out "$tmp/tls.crt" 2>/dev/null
cp "$tmp/tls.crt" "$tmp/ca.crt"
for f in "${files[@]}"; do
  if grep -q '/etc/envoy/xds/' "$f"; then
    sed "s#/etc/envoy/xds/#$tmp/#g" "$f" > "$tmp/bootstrap.yaml"
    check="$tmp/bootstrap.yaml"
  else
    check="$f"
  fi
  if out=$("$envoy" --mode validate -c "$check" -l warning 2>&1); then
    echo "ok   $f"
  else
    echo "FAIL $f" >&2
    echo "$out" | tail -n 20 >&2
    exit 1
  fi
done
