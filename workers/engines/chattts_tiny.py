"""Build the tiny random-weight ChatTTS model folder that tests and `make tiny-model` use.

The builder is chattts_random.py's, at its tiny preset; ``--preset full`` builds the real-size one here too.
"""

from __future__ import annotations

import sys
from pathlib import Path

from workers.engines.chattts_assets import read_descriptor
from workers.engines.chattts_random import build_random_model
from workers.engines.chattts_random import is_complete as _is_complete
from workers.engines.chattts_random import main as _main
from workers.engines.chattts_vocab import SPECIAL_TOKENS

__all__ = ["SPECIAL_TOKENS", "build_tiny_model", "is_complete", "main", "read_tiny_config"]

#: The descriptor reader's old name here, which tests import.
read_tiny_config = read_descriptor


def build_tiny_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Write a tiny random-weight ChatTTS model (asset layout) into ``out_dir`` and return it."""
    return build_random_model(out_dir, preset="tiny", seed=seed)


def is_complete(out_dir: Path, *, seed: int = 0) -> bool:
    """Say whether ``out_dir`` holds a whole tiny model of ``seed`` whose files match their hashes."""
    return _is_complete(out_dir, preset="tiny", seed=seed)


def main(argv: list[str] | None = None) -> int:
    """Build the tiny model into the directory named on the command line unless it is already there."""
    return _main(argv, prog="python -m workers.engines.chattts_tiny")


if __name__ == "__main__":
    sys.exit(main())
