"""Build a random-weight ChatTTS model folder, tiny (tests) or at ChatTTS's real sizes (benchmarks), seeded.

``python -m workers.engines.chattts_random --preset full models/chattts-random`` writes ChatTTS's own asset
layout with random weights and a descriptor (random_weights.json) that marks it as random; nothing is
downloaded. The loader (chattts.py) loads it with the same code as real weights and skips only the hash check.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pybase16384 as b14
import torch
from safetensors.torch import save_file

from workers.engines.chattts_assets import (
    ASSET_FILES,
    DESCRIPTOR_NAME,
    LEGACY_DESCRIPTOR_NAME,
    descriptor_config,
    read_descriptor,
)
from workers.engines.chattts_presets import PRESETS, SizePreset
from workers.engines.chattts_vocab import SPECIAL_TOKENS, vocabulary

#: Bumped whenever a build would differ: a folder of an older format is rebuilt.
FORMAT = 2


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def is_complete(out_dir: Path, *, preset: str = "tiny", seed: int = 0) -> bool:
    """Say whether ``out_dir`` holds a whole random model of ``preset`` and ``seed`` whose files match their hashes."""
    try:
        descriptor = read_descriptor(out_dir)
    except (OSError, ValueError):
        return False
    if descriptor is None:
        return False
    if (descriptor.get("format"), descriptor.get("preset"), descriptor.get("seed")) != (FORMAT, preset, seed):
        return False
    hashes, sizes = descriptor.get("sha256", {}), descriptor.get("bytes", {})
    for key, rel in ASSET_FILES.items():
        path = out_dir / rel
        if not path.is_file() or sizes.get(key) != path.stat().st_size or hashes.get(key) != _sha256(path):
            return False
    return True


def _save_tokenizer(directory: Path, vocab_size: int) -> int:
    # In transformers 5 this is the tokenizers-backed class ChatTTS loads as BertTokenizerFast.
    from transformers import BertTokenizer

    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(vocabulary(vocab_size))})
    tokenizer.add_tokens(SPECIAL_TOKENS, special_tokens=True)
    tokenizer.save_pretrained(str(directory))
    # transformers 5 no longer writes this file, but ChatTTS hash-checks it.
    (directory / "special_tokens_map.json").write_text("{}\n", encoding="utf-8")
    return len(tokenizer)


def _speaker_stat(hidden: int, generator: torch.Generator) -> str:
    """Return random speaker statistics as ChatTTS stores them: 2×hidden float16 values (std, then mean)."""
    std = torch.rand(hidden, generator=generator) * 0.5 + 0.5
    mean = torch.randn(hidden, generator=generator) * 0.1
    stat = torch.cat([std, mean]).to(torch.float16).numpy()
    encoded: str = b14.encode_to_string(np.ascontiguousarray(stat).tobytes())
    return encoded


def _save(module: torch.nn.Module, path: Path) -> None:
    tensors = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def _save_modules(asset: Path, cfg: Any) -> None:
    from ChatTTS.model import DVAE, Embed
    from transformers import LlamaConfig, LlamaModel
    from vocos import Vocos
    from vocos.pretrained import instantiate_class

    # Each module is saved and dropped before the next is built, so a full-size build holds one at a time.
    vocos = Vocos(
        feature_extractor=instantiate_class(args=(), init=asdict(cfg.vocos.feature_extractor)),
        backbone=instantiate_class(args=(), init=asdict(cfg.vocos.backbone)),
        head=instantiate_class(args=(), init=asdict(cfg.vocos.head)),
    )
    _save(vocos, asset / "Vocos.safetensors")
    del vocos
    dvae = DVAE(
        decoder_config=asdict(cfg.dvae.decoder),
        encoder_config=asdict(cfg.dvae.encoder),
        vq_config=asdict(cfg.dvae.vq),
        dim=cfg.dvae.decoder.idim,
    )
    _save(dvae, asset / "DVAE.safetensors")
    del dvae
    _save(DVAE(decoder_config=asdict(cfg.decoder), dim=cfg.decoder.idim), asset / "Decoder.safetensors")
    embed = Embed(cfg.embed.hidden_size, cfg.embed.num_audio_tokens, cfg.embed.num_text_tokens, cfg.embed.num_vq)
    _save(embed, asset / "Embed.safetensors")
    del embed
    gpt = cfg.gpt
    llama_config = LlamaConfig(
        hidden_size=gpt.hidden_size,
        intermediate_size=gpt.intermediate_size,
        num_attention_heads=gpt.num_attention_heads,
        num_hidden_layers=gpt.num_hidden_layers,
        max_position_embeddings=gpt.max_position_embeddings,
        # ChatTTS deletes the Llama's own token embedding after loading (it embeds through Embed): keep it small.
        vocab_size=32,
    )
    # Saved by hand rather than with save_pretrained, which draws a progress bar.
    llama_config.save_pretrained(str(asset / "gpt"))
    _save(LlamaModel(llama_config), asset / "gpt" / "model.safetensors")


def build_random_model(out_dir: Path, *, preset: str = "tiny", seed: int = 0) -> Path:
    """Write a random-weight ChatTTS of ``preset``'s sizes (asset layout) into ``out_dir`` and return it."""
    sizes_of: SizePreset = PRESETS[preset]
    out_dir = Path(out_dir)
    for name in (DESCRIPTOR_NAME, LEGACY_DESCRIPTOR_NAME):
        (out_dir / name).unlink(missing_ok=True)
    asset = out_dir / "asset"
    for sub in ("gpt", "tokenizer"):
        (asset / sub).mkdir(parents=True, exist_ok=True)
    num_text_tokens = _save_tokenizer(asset / "tokenizer", sizes_of.vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        spk_stat = _speaker_stat(sizes_of.hidden, torch.Generator().manual_seed(seed))
        sizes = sizes_of.sizes(num_text_tokens, spk_stat)
        _save_modules(asset, descriptor_config(sizes))
    descriptor = {
        "format": FORMAT,
        "random_weights": True,
        "preset": preset,
        "seed": seed,
        "sizes": sizes,
        "bytes": {key: (out_dir / rel).stat().st_size for key, rel in ASSET_FILES.items()},
        "sha256": {key: _sha256(out_dir / rel) for key, rel in ASSET_FILES.items()},
    }
    # Written last, through a rename, so its presence means the build finished.
    with tempfile.NamedTemporaryFile("w", dir=out_dir, suffix=".tmp", delete=False, encoding="utf-8") as f:
        json.dump(descriptor, f, indent=1, ensure_ascii=False)
    Path(f.name).replace(out_dir / DESCRIPTOR_NAME)
    for path in (out_dir / DESCRIPTOR_NAME, *(out_dir / rel for rel in ASSET_FILES.values())):
        path.chmod(0o644)
    return out_dir


def main(argv: list[str] | None = None, *, prog: str = "python -m workers.engines.chattts_random") -> int:
    """Build the random model into the directory named on the command line unless it is already there."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="tiny (tests) or full (real sizes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if a complete model is there")
    args = parser.parse_args(argv)
    if not args.force and is_complete(args.out_dir, preset=args.preset, seed=args.seed):
        print(f"{args.preset} random-weight ChatTTS already complete in {args.out_dir}; nothing to do")
        return 0
    build_random_model(args.out_dir, preset=args.preset, seed=args.seed)
    print(f"built {args.preset} random-weight ChatTTS (seed {args.seed}) in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
