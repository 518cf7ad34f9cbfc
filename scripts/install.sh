#!/usr/bin/env bash
# Create the virtual environment and install the pinned requirements.
#   scripts/install.sh requirements.txt [requirements-dev.txt ...]
# torch comes first: the CUDA build where an NVIDIA GPU is visible, else the CPU
# build (a plain `pip install torch` would pull several GB of CUDA libraries).
# Every install is held to constraints.txt: the exact versions of everything the requirements
# pull in, as tested (scripts/pin_constraints.py). CONSTRAINTS=other.txt uses another file;
# CONSTRAINTS= (empty: `make constraints` does it, to take up changed requirements) none.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
CONSTRAINTS=${CONSTRAINTS-$(cd "$(dirname "$0")/.." && pwd)/constraints.txt}
# shellcheck source=scripts/prereqs.sh
. "$(dirname "$0")/prereqs.sh"

if [ ! -x "$VENV/bin/python" ]; then
  need_python "$PYTHON"
  need_venv_support "$PYTHON"
  echo "==> creating virtual environment in $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
elif ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  # A venv without pip: what `python3 -m venv` leaves behind on Debian before python3.X-venv is installed.
  need_venv_support "$VENV/bin/python"
  echo "==> adding pip to the virtual environment in $VENV"
  "$VENV/bin/python" -m ensurepip --upgrade >/dev/null
  "$VENV/bin/pip" install --quiet --upgrade pip
fi
PIP=("$VENV/bin/pip" install --quiet)
PINNED=("${PIP[@]}")
held="unconstrained"
if [ -n "$CONSTRAINTS" ]; then
  PINNED+=(--constraint "$CONSTRAINTS")
  held="versions held to $(basename "$CONSTRAINTS")"
fi

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "==> installing torch $TORCH_VERSION (CUDA build: a GPU is visible)"
    "${PINNED[@]}" "torch==$TORCH_VERSION"
  else
    echo "==> installing torch $TORCH_VERSION (CPU build: no GPU visible)"
    # PyTorch's own index may lack the pinned versions of torch's dependencies: those from
    # there are brought to the pinned ones by the constrained install below.
    "${PINNED[@]}" "torch==$TORCH_VERSION+cpu" 2>/dev/null \
      || "${PIP[@]}" "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
  fi
fi

for req in "$@"; do
  echo "==> installing $req ($held)"
  "${PINNED[@]}" -r "$req"
done

# PyPI's torchaudio links against CUDA; on a CPU-only torch, make it importable.
"$VENV/bin/python" scripts/fix_torchaudio_cpu.py
