"""Build a tiny random-weight ChatTTS model directory so ChatTTS's real code runs in tests."""

from __future__ import annotations

import argparse
import hashlib
import json
import string
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pybase16384 as b14
import torch
from safetensors.torch import save_file

from workers.engines.chattts_assets import ASSET_FILES, DESCRIPTOR_NAME, descriptor_config, read_descriptor

#: The descriptor reader's old name here, which tests import.
read_tiny_config = read_descriptor

_FORMAT = 1
_HIDDEN = 64

#: ChatTTS's special tokens, in the library's order: its code relies on their relative ids.
_NAMED_TOKENS = (
    "Sasr Pasr Easr Stts Ptts Etts Sbreak Pbreak Ebreak uv_break v_break lbreak llbreak undefine laugh spk_emb "
    "empty_spk music pure"
)
SPECIAL_TOKENS = [
    *(f"[{name}]" for name in _NAMED_TOKENS.split()),
    *(f"[break_{i}]" for i in range(8)),
    *(f"[laugh_{i}]" for i in range(3)),
    *(f"[oral_{i}]" for i in range(10)),
    *(f"[speed_{i}]" for i in range(10)),
]


def _tiny_sizes(num_text_tokens: int, spk_stat: str) -> dict[str, Any]:
    half = _HIDDEN // 2
    return {
        "gpt": {
            "hidden_size": _HIDDEN,
            "intermediate_size": 2 * _HIDDEN,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_text_tokens": num_text_tokens,
        },
        "embed": {"hidden_size": _HIDDEN, "num_text_tokens": num_text_tokens},
        "decoder": {"idim": half, "odim": half, "hidden": 32, "n_layer": 1, "bn_dim": 16},
        "dvae": {
            "encoder": {"idim": 32, "odim": 64, "hidden": 32, "n_layer": 1, "bn_dim": 16},
            "decoder": {"idim": 32, "odim": 32, "hidden": 32, "n_layer": 1, "bn_dim": 16},
            "vq": {"dim": 64},
        },
        "vocos": {
            "backbone": {"dim": 64, "intermediate_dim": 128, "num_layers": 1},
            "head": {"dim": 64},
        },
        "spk_stat": spk_stat,
    }


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def is_complete(out_dir: Path, *, seed: int = 0) -> bool:
    """Say whether ``out_dir`` holds a whole tiny model of ``seed`` whose files match their hashes."""
    try:
        descriptor = read_descriptor(out_dir)
    except (OSError, ValueError):
        return False
    if descriptor is None or descriptor.get("format") != _FORMAT or descriptor.get("seed") != seed:
        return False
    hashes = descriptor.get("sha256", {})
    return all(
        (out_dir / rel).is_file() and hashes.get(key) == _sha256(out_dir / rel) for key, rel in ASSET_FILES.items()
    )


def _vocab() -> list[str]:
    letters = string.ascii_lowercase
    punctuation = list(",.?!'，。、？！")
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *(f"##{ch}" for ch in letters), *punctuation]


def _save_tokenizer(directory: Path) -> int:
    # In transformers 5 this is the tokenizers-backed class ChatTTS loads as BertTokenizerFast.
    from transformers import BertTokenizer

    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(_vocab())})
    tokenizer.add_tokens(SPECIAL_TOKENS, special_tokens=True)
    tokenizer.save_pretrained(str(directory))
    # transformers 5 no longer writes this file, but ChatTTS hash-checks it.
    (directory / "special_tokens_map.json").write_text("{}\n", encoding="utf-8")
    return len(tokenizer)


def _speaker_stat(generator: torch.Generator) -> str:
    std = torch.rand(_HIDDEN, generator=generator) * 0.5 + 0.5
    mean = torch.randn(_HIDDEN, generator=generator) * 0.1
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

    vocos = Vocos(
        feature_extractor=instantiate_class(args=(), init=asdict(cfg.vocos.feature_extractor)),
        backbone=instantiate_class(args=(), init=asdict(cfg.vocos.backbone)),
        head=instantiate_class(args=(), init=asdict(cfg.vocos.head)),
    )
    dvae = DVAE(
        decoder_config=asdict(cfg.dvae.decoder),
        encoder_config=asdict(cfg.dvae.encoder),
        vq_config=asdict(cfg.dvae.vq),
        dim=cfg.dvae.decoder.idim,
    )
    decoder = DVAE(decoder_config=asdict(cfg.decoder), dim=cfg.decoder.idim)
    embed = Embed(cfg.embed.hidden_size, cfg.embed.num_audio_tokens, cfg.embed.num_text_tokens, cfg.embed.num_vq)
    for name, module in (("Vocos", vocos), ("DVAE", dvae), ("Decoder", decoder), ("Embed", embed)):
        _save(module, asset / f"{name}.safetensors")
    gpt = cfg.gpt
    llama_config = LlamaConfig(
        hidden_size=gpt.hidden_size,
        intermediate_size=gpt.intermediate_size,
        num_attention_heads=gpt.num_attention_heads,
        num_hidden_layers=gpt.num_hidden_layers,
        max_position_embeddings=gpt.max_position_embeddings,
        vocab_size=32,
    )
    # Saved by hand rather than with save_pretrained, which draws a progress bar.
    llama_config.save_pretrained(str(asset / "gpt"))
    _save(LlamaModel(llama_config), asset / "gpt" / "model.safetensors")


def build_tiny_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Write a tiny random-weight ChatTTS model (asset layout) into ``out_dir`` and return it."""
    out_dir = Path(out_dir)
    (out_dir / DESCRIPTOR_NAME).unlink(missing_ok=True)
    asset = out_dir / "asset"
    for sub in ("gpt", "tokenizer"):
        (asset / sub).mkdir(parents=True, exist_ok=True)
    num_text_tokens = _save_tokenizer(asset / "tokenizer")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        spk_stat = _speaker_stat(torch.Generator().manual_seed(seed))
        sizes = _tiny_sizes(num_text_tokens, spk_stat)
        _save_modules(asset, descriptor_config(sizes))
    descriptor = {
        "format": _FORMAT,
        "seed": seed,
        "sizes": sizes,
        "sha256": {key: _sha256(out_dir / rel) for key, rel in ASSET_FILES.items()},
    }
    # Written last, through a rename, so its presence means the build finished.
    with tempfile.NamedTemporaryFile("w", dir=out_dir, suffix=".tmp", delete=False, encoding="utf-8") as f:
        json.dump(descriptor, f, indent=1, ensure_ascii=False)
    Path(f.name).replace(out_dir / DESCRIPTOR_NAME)
    for path in (out_dir / DESCRIPTOR_NAME, *(out_dir / rel for rel in ASSET_FILES.values())):
        path.chmod(0o644)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """Build the tiny model into the directory named on the command line unless it is already there."""
    parser = argparse.ArgumentParser(prog="python -m workers.engines.chattts_tiny", description=__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if a complete model is there")
    args = parser.parse_args(argv)
    if not args.force and is_complete(args.out_dir, seed=args.seed):
        print(f"tiny ChatTTS model already complete in {args.out_dir}; nothing to do")
        return 0
    build_tiny_model(args.out_dir, seed=args.seed)
    print(f"built tiny ChatTTS model (seed {args.seed}) in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
