"""The tiny random-weight ChatTTS the HTTP and in-process benches run, and how many torch threads it gets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from devstack.local import ROOT

MODEL = "chattts-tiny"
#: Torch threads per model host. One, not two: on 2 shared cores a second OpenMP thread that loses its core
#: stalls every one of the tiny model's many small ops.
TORCH_THREADS = int(os.environ.get("BENCH_TORCH_THREADS", "1"))


def ensure_tiny_model() -> Path:
    """Build the tiny ChatTTS into models/chattts-tiny unless it is complete, and return its folder."""
    # In a child process: importing the builder imports torch, which would inflate this process's memory.
    out_dir = Path(os.environ.get("TTS_TINY_MODEL_DIR", ROOT / "models" / "chattts-tiny")).resolve()
    subprocess.run([sys.executable, "-m", "workers.engines.chattts_tiny", str(out_dir)], cwd=ROOT, check=True)
    return out_dir
