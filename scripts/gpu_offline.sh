#!/usr/bin/env bash
# `make gpu-check` on a GPU machine with Python, torch and CUDA but no package registry and no Redis, from what
# scripts/offline_bundle.sh gathered (.whl/ and .gpu/ carried beside the checkout). Installs the wheels into that
# Python, puts the carried redis-server first on PATH, runs the engine on the tiny model in fp16 and bf16 on the GPU
# (a broken CUDA path shows here, not minutes into the check; TINY_FIRST=0 skips it), then the check itself. Its log, the table
# and the check's folder (worker and API logs) go to OUT (default bench/results/offline). Arguments go to the check;
# DEADLINE_S (570) is when, from its start, the script must have finished.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/offline}
PY=${PY:-python3}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1 PATH="$PWD/.gpu/bin:$PATH"
stage() { echo "==> $(date -u +%T) $*"; }
keep() {  # what the check wrote, for the caller to read
  cp bench/results/gpu_check.md "$OUT/" 2>/dev/null
  tar czf "$OUT/check.tgz" bench/results/gpu-check-* 2>/dev/null
}
stage machine
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; $PY -V; nproc
stage wheels
if compgen -G ".whl/*.whl" >/dev/null; then  # none where the Python already has the project's packages
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl || exit 3
fi
stage redis
redis-server --version || exit 4
stage imports
$PY -c "import torch, transformers, ChatTTS, celery, flask, gevent, gunicorn, soundfile, pydantic
print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())" || exit 5
fallback=()
if [ "${TINY_FIRST:-1}" = 1 ]; then  # TINY_FIRST=0 skips it: on the first H200 it took 3 of the 10 minutes
  stage "tiny model on ${DEVICE:-cuda:0}, CUDA graphs on"
  $PY -m workers.engines.chattts_tiny models/chattts-tiny >/dev/null || exit 6
  # The graphed path is what is new; if it fails here, the check still runs, with graphs off everywhere, so that
  # one lease still gives the eager figures (and this stage's log says why).
  TTS_TINY_MODEL_DIR=models/chattts-tiny timeout 120 $PY -m bench.gpu_check --model chattts-tiny --no-build \
    --device "${DEVICE:-cuda:0}" --precisions fp16,bf16 --batches 1,4 --steps 64 --graphs on --skip-service \
    --new-lengths "" --out "$OUT/tiny" || { echo "the graphed tiny stage failed: the check runs with graphs off"
                                              fallback=(--graphs off --service-graphs off); }
fi
# The check gets what is left of DEADLINE_S (from this script's start) less 20 s, so that the logs are kept
# before whoever runs this stops it: on the first H200 the caller's limit came first, and they were lost.
left=$(( ${DEADLINE_S:-570} - SECONDS - 20 ))
stage gpu check "$@" "${fallback[@]}" "(stopped after ${left}s)"
timeout "$left" $PY -m bench.gpu_check "$@" "${fallback[@]}"
rc=$?
stage "done (exit $rc)"
keep
exit $rc
