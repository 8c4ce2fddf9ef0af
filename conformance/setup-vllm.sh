#!/usr/bin/env bash
# Create .engines/vllm-VERSION: the real vLLM wheel on a CPU-only torch, for
# conformance/vllm_oracle.py. Idempotent: a finished venv with the same pins is
# left alone.  Usage: conformance/setup-vllm.sh 0.34.0   (or 0.33.0)
#
# Everything is installed with --no-deps from the pin list below, so pip can
# never pull a CUDA torch or vLLM's GPU-only dependencies (flashinfer, cutlass,
# deep-gemm, ...). The list is what the oracle's imports actually need.
set -euo pipefail

VERSION="${1:?usage: setup-vllm.sh VERSION (0.33.0 or 0.34.0)}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${SHARDWISE_ENGINES_DIR:-$ROOT/.engines}/vllm-$VERSION"   # where the tests look too
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3

case "$VERSION" in
  0.33.0) TRANSFORMERS=transformers==5.20.2 ;;  # vllm 0.33.0: transformers<5.21
  0.34.0) TRANSFORMERS=transformers==5.22.2 ;;  # vllm 0.34.0: transformers<5.23
  *) echo "unsupported vLLM version $VERSION (have pins for 0.33.0, 0.34.0)" >&2; exit 2 ;;
esac

# torch 2.13.0 CPU: pip finds /opt/wheels/torch-2.13.0+cpu-... via find-links
# (vLLM pins torch 2.14.0 CUDA; its CUDA extensions are stubbed by the oracle).
PINS=(
  "vllm==$VERSION" "torch==2.13.0" "$TRANSFORMERS"
  triton==3.9.0  # vLLM reads HAS_TRITON at import (gates e.g. Model Runner V2)
  Jinja2==3.1.6 MarkupSafe==3.0.4 PyYAML==6.0.4 Pygments==2.21.0
  aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7
  annotated-types==0.8.0 anyio==4.16.0 apache-tvm-ffi==0.1.11 attrs==26.1.0
  cachetools==8.0.2 cbor2==6.3.0 certifi==2026.10.19.post1 charset-normalizer==3.5.3
  click==8.5.1 cloudpickle==3.1.3 compressed-tensors==0.17.0 einops==0.8.2
  fastapi==0.136.3 filelock==4.3.1 frozenlist==1.8.0 fsspec==2026.9.0 h11==0.16.0
  hf-xet==1.8.0 httpcore2==2.16.2 httpx2==2.16.2 huggingface_hub==2.4.0 idna==3.20
  jiter==0.19.0 llguidance==1.7.6 loguru==0.7.3 markdown-it-py==4.3.0 mdurl==0.1.2
  mpmath==1.3.0 msgspec==0.23.0 multidict==7.2.1 networkx==3.6.1 numpy==2.4.6
  openai-harmony==0.0.8 openai==3.57.0 orjson==3.13.0 packaging==26.4
  partial-json-parser==0.2.1.1.post7 pillow==13.0.0 prometheus_client==0.26.0
  propcache==0.5.4 psutil==7.2.2 py-cpuinfo==9.0.0 pybase64==1.5.1 pydantic==2.14.4
  pydantic_core==2.50.5 pyzmq==27.3.0 regex==2026.11.19 requests==2.34.2 rich==15.0.0
  safetensors==0.8.0 shellingham==1.5.4 sniffio==1.3.1 starlette==1.10.0 sympy==1.14.0
  tokenizers==0.23.3 tqdm==4.70.1 truststore==0.10.5 typer==0.29.2
  typing-inspection==0.4.5 typing_extensions==4.16.0 urllib3==2.8.0 uvicorn==0.55.0
  uvloop==0.23.0 watchfiles==1.3.0 xgrammar==0.2.8 yarl==1.25.1
)
STAMP="$VENV/.oracle-pins"
WANT="$(printf '%s\n' "${PINS[@]}")"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "vllm-$VERSION: up to date ($VENV)"; exit 0
fi

start=$SECONDS
rm -rf "$VENV"
"$PY" -m venv "$VENV"
# pip's own output is shown, less the harmless "Location 'file:...' is ignored"
# warnings the find-links setup prints; a failed install stops here with pip's
# error above (pipefail carries pip's status through the filter). Without the
# stamp, the next run starts again from an empty venv.
if ! "$VENV/bin/pip" install --quiet --no-deps --only-binary=:all: "${PINS[@]}" 2>&1 \
    | { grep -v "^WARNING: Location 'file" || true; }; then
  echo "vllm-$VERSION: pip install failed (its error is above); $VENV is incomplete" >&2
  exit 1
fi
# Sanity: the wheel and torch are what we asked for, and torch is the CPU build.
"$VENV/bin/python" - "$VERSION" <<'EOF'
import sys, importlib.metadata as md, torch
assert md.version("vllm") == sys.argv[1], md.version("vllm")
assert torch.version.cuda is None and torch.__version__.startswith("2.13.0"), torch.__version__
EOF
printf '%s\n' "$WANT" > "$STAMP"
echo "vllm-$VERSION: installed in $((SECONDS - start))s, $(du -sh "$VENV" | cut -f1) at $VENV"
