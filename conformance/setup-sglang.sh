#!/usr/bin/env bash
# Create the venv the SGLang oracle runs in: real sglang 0.5.23 + CPU torch 2.13.0.
#   bash conformance/setup-sglang.sh            # -> .engines/sglang-0.5.23
#   SHARDWISE_ENGINES_DIR=~/.cache/shardwise/engines bash conformance/setup-sglang.sh   # elsewhere
# Idempotent: a venv whose stamp matches the requirements file is left alone.
# Never pulls a CUDA torch: torch comes from the local CPU wheel and every other
# package is installed with --no-deps from the pinned list next to this script.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
VENV="${SHARDWISE_ENGINES_DIR:-$ROOT/.engines}/sglang-0.5.23"
REQS="$HERE/sglang-0.5.23-requirements.txt"
TORCH_WHEEL="${TORCH_WHEEL:-/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}"
STAMP="$VENV/.oracle-stamp"
WANT="$(cat "$REQS" "$0" | sha256sum | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] \
   && "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('sglang') == '0.5.23'" 2>/dev/null; then
  echo "sglang oracle venv up to date: $VENV"
  exit 0
fi

start=$SECONDS
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)

if [[ -f "$TORCH_WHEEL" ]]; then
  "${PIP[@]}" --no-deps "$TORCH_WHEEL"
else  # a machine whose pip config points at the CPU wheel
  "${PIP[@]}" --no-deps "torch==2.13.0"
fi
"${PIP[@]}" --no-deps "sglang==0.5.23"
"${PIP[@]}" --no-deps -r "$REQS"
"$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.version.cuda is None else 'CUDA torch installed; refusing')"

"$VENV/bin/python" -c "import sglang.srt.server_args" >/dev/null 2>&1 || true  # byte-compile warm-up
echo "$WANT" > "$STAMP"
echo "sglang oracle venv ready: $VENV ($(du -sh "$VENV" | cut -f1), $((SECONDS - start))s)"
