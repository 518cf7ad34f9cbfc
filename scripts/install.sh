#!/usr/bin/env bash
# Create the virtual environment and install the pinned requirements.
#   scripts/install.sh requirements.txt [requirements-dev.txt ...]
# torch comes first: the CUDA build where an NVIDIA GPU is visible, else the CPU
# build (a plain `pip install torch` would pull several GB of CUDA libraries).
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating virtual environment in $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
fi
PIP=("$VENV/bin/pip" install --quiet)

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "==> installing torch $TORCH_VERSION (CUDA build: a GPU is visible)"
    "${PIP[@]}" "torch==$TORCH_VERSION"
  else
    echo "==> installing torch $TORCH_VERSION (CPU build: no GPU visible)"
    "${PIP[@]}" "torch==$TORCH_VERSION+cpu" 2>/dev/null \
      || "${PIP[@]}" "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
  fi
fi

for req in "$@"; do
  echo "==> installing $req"
  "${PIP[@]}" -r "$req"
done

# PyPI's torchaudio links against CUDA; on a CPU-only torch, make it importable.
"$VENV/bin/python" scripts/fix_torchaudio_cpu.py
