"""Make torchaudio importable beside a CPU-only build of torch.

PyPI's torchaudio wheels link their compiled extensions against CUDA, so on a
CPU build of torch ``import torchaudio`` fails with ``libc10_cuda.so: cannot
open``. ChatTTS (and vocos) import torchaudio only for its pure-Python
``transforms.MelSpectrogram``. torchaudio treats missing compiled libraries as
"no extension", so renaming them makes the import work and MelSpectrogram keeps
working. This is done only when torch has no CUDA; on a CUDA build nothing is
touched.
"""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys


def _torchaudio_imports() -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", "import torchaudio.transforms"],
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.returncode == 0


def main() -> int:
    """Disable torchaudio's CUDA-linked libraries when torch is a CPU build."""
    import torch

    if torch.version.cuda is not None:
        print("torch has CUDA: torchaudio left as installed")
        return 0
    spec = importlib.util.find_spec("torchaudio")
    if spec is None or spec.origin is None:
        print("torchaudio not installed: nothing to fix")
        return 0
    if _torchaudio_imports():
        return 0
    lib_dir = pathlib.Path(spec.origin).parent / "lib"
    for lib in sorted(lib_dir.glob("*.so")):
        lib.rename(lib.with_suffix(".so.disabled-on-cpu-torch"))
        print(f"CPU-only torch: disabled {lib.name} (linked against CUDA)")
    if not _torchaudio_imports():
        print("torchaudio still fails to import; see README 'Troubleshooting'", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
