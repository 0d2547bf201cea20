#!/usr/bin/env bash
# Installs the Debian packages the test peers need (see shared TEST-PEERS.md), only if missing.
# As root it uses apt-get; otherwise passwordless sudo; otherwise it says what is missing
# and the tests that need those peers skip with that reason.
set -euo pipefail
# package:command-that-proves-it
NEEDED=(
  "kubernetes-client:kubectl"
)
missing=()
for entry in "${NEEDED[@]}"; do
  pkg=${entry%%:*}; cmd=${entry#*:}
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
  echo "system-deps: not root and no passwordless sudo; missing: ${missing[*]} (tests needing them will skip)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || echo "system-deps: apt-get update failed; trying the install anyway" >&2
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
