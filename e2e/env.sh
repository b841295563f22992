# Source this: installs (or reuses) the servers the tests need and exports
# their paths. `source e2e/env.sh` or `. e2e/env.sh consul envoy`.
_mb_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
eval "$("$_mb_root/e2e/setup.sh" "$@")"
unset _mb_root
