#!/usr/bin/env bash
# Gather what `make gpu-check` needs on a GPU machine that has Python, torch and CUDA but no package registry
# and no Redis (scripts/gpu_offline.sh runs it there): the project's wheels that such an image lacks, for its
# Python (PYTHON_VERSION, default 3.12), in .whl/, and this machine's redis-server with the libraries it links
# in .gpu/. Both folders are ignored by git (add them to .git/info/exclude); carry them to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
# The image's own torch, torchaudio, numpy, scipy, numba, tokenizers, huggingface_hub, safetensors, requests and
# prometheus-client stay; these are the rest of requirements.txt's closure (versions from constraints.txt).
WHEELS="amqp billiard blinker celery click-didyoumean click-plugins click-repl Deprecated einx Flask flask-sock
frozendict gevent greenlet gunicorn itsdangerous kombu limits loguru prompt_toolkit pybase16384 pydantic
pydantic-settings pydantic_core python-dotenv redis simple-websocket soundfile torch-einops-utils transformers
typing-inspection annotated-types tzlocal vector-quantize-pytorch vine vocos wcwidth Werkzeug wsproto zope.event
zope.interface cffi pycparser"
SDISTS="chattts encodec"  # published as source only: built into wheels here (pure Python)
pin() { grep -i -m1 "^$1==" constraints.txt || { echo "$1 is not in constraints.txt" >&2; exit 1; }; }
mkdir -p .whl .gpu/bin .gpu/redis/lib
for name in $WHEELS; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    -d .whl "$(pin "$name")"
done
for name in $SDISTS; do python3 -m pip wheel -q --no-deps -w .whl "$(pin "$name")"; done
scripts/ensure_redis_server.sh
cp -L "$(command -v redis-server)" .gpu/redis/redis-server.bin  # not named redis-check-rdb: argv[0] picks the mode
cp -L "$(command -v redis-cli)" .gpu/redis/redis-cli.bin
ldd .gpu/redis/redis-server.bin .gpu/redis/redis-cli.bin | awk '/=> \// {print $3}' | sort -u \
  | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' | xargs -I{} cp -L {} .gpu/redis/lib/
for tool in redis-server redis-cli; do
  printf '#!/bin/sh\nhere=$(cd "$(dirname "$0")/../redis" && pwd)\nLD_LIBRARY_PATH="$here/lib" exec "$here/%s.bin" "$@"\n' \
    "$tool" > ".gpu/bin/$tool"
  chmod +x ".gpu/bin/$tool"
done
du -sh .whl .gpu
