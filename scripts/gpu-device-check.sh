#!/usr/bin/env bash
# Device check on a real GPU host (no network needed): the idleness agent's GPU source
# (agents/sources/gpu_activity.py) and the GPU agent's NVML reads (agents/sources/nvml.py).
#
#   scripts/gpu-device-check.sh [OUT_DIR] [-- extra args for bench/gpu_real.py]
#
# OUT_DIR defaults to $OUT (the device runner's result folder), else /tmp/gpu-device-check.
# It gets nvidia-smi.txt, gpu_real.log and gpu_real.json. Needs python3 with nvidia-ml-py,
# and torch for the load (without torch the series only shows idle and the check fails).
# bench/gpu_real.py imports no pydantic/structlog; if .whl/ holds wheels (made here with
# scripts/device-wheels.sh), they are installed into OUT_DIR/.site, never system-wide.
# Takes about 40 s (torch import and CUDA init, then a 20 s series). Exit status: the
# check's (0: active -> idle seen and every step ran).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/gpu-device-check}}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
mkdir -p "$out"
py=${PYTHON:-python3}

if compgen -G ".whl/*.whl" >/dev/null; then
  echo "== installing carried wheels from .whl/ into $out/.site"
  "$py" -m pip install -q --no-index --no-deps --find-links .whl --target "$out/.site" .whl/*.whl \
    || echo "!! wheel install failed: going on without them"
  export PYTHONPATH="$out/.site${PYTHONPATH:+:$PYTHONPATH}"
fi

{
  echo "== host: $(uname -srm), $("$py" --version 2>&1)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L
    nvidia-smi --query-gpu=index,name,uuid,driver_version,mig.mode.current,utilization.gpu,power.draw \
      --format=csv
  else
    echo "nvidia-smi: not on PATH"
  fi
  "$py" - <<'PY'
import importlib
for name in ("pynvml", "torch", "httpx", "pydantic", "structlog"):
    try:
        mod = importlib.import_module(name)
        print(f"{name}: {getattr(mod, '__version__', 'present')}")
    except Exception as exc:  # what is missing is what this line is for
        print(f"{name}: missing ({type(exc).__name__})")
PY
} 2>&1 | tee "$out/nvidia-smi.txt"

timeout 300 "$py" bench/gpu_real.py --out "$out" "$@" 2>&1 | tee "$out/gpu_real.log"
rc=${PIPESTATUS[0]}
echo "== gpu_real.py exit status $rc; results in $out"
exit "$rc"
