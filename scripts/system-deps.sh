#!/usr/bin/env bash
# Installs the Debian packages the test peers need (see shared TEST-PEERS.md), only if missing.
# As root it uses apt-get; otherwise passwordless sudo; otherwise it says what is missing
# and the tests that need those peers skip with that reason.
set -euo pipefail
# package:command-that-proves-it
NEEDED=(
  "kubernetes-client:kubectl"
  "prometheus-alertmanager:prometheus-alertmanager"
)
missing=()
for entry in "${NEEDED[@]}"; do
  pkg=${entry%%:*}; cmd=${entry#*:}
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
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

[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
  echo "system-deps: not root and no passwordless sudo; missing: ${missing[*]} (tests needing them will skip)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || echo "system-deps: apt-get update failed; trying the install anyway" >&2
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
