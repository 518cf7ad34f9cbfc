"""A ChatTTS model folder: its asset layout, where it may sit, and the descriptor a random-weight model carries.

Real weights are ChatTTS's own files, checked against ChatTTS's own SHA-256 map. A random-weight model (built by
chattts_random.py for tests and benchmarks) carries a small JSON descriptor of its sizes, file sizes and hashes
instead, and is loaded without the hash check.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workers.engines.errors import EngineLoadError

#: The descriptor that marks a random-weight model and carries the sizes ChatTTS's Config must take.
DESCRIPTOR_NAME = "random_weights.json"
#: Its name before full-size random models existed; folders built then still load.
LEGACY_DESCRIPTOR_NAME = "tiny_config.json"

HF_SNAPSHOTS = Path("models--2Noise--ChatTTS") / "snapshots"

#: Each asset ChatTTS hash-checks, keyed as in ``ChatTTS/res/sha256_map.json``.
ASSET_FILES = {
    "sha256_asset_Decoder_safetensors": "asset/Decoder.safetensors",
    "sha256_asset_DVAE_safetensors": "asset/DVAE.safetensors",
    "sha256_asset_Embed_safetensors": "asset/Embed.safetensors",
    "sha256_asset_Vocos_safetensors": "asset/Vocos.safetensors",
    "sha256_asset_gpt_config_json": "asset/gpt/config.json",
    "sha256_asset_gpt_model_safetensors": "asset/gpt/model.safetensors",
    "sha256_asset_tokenizer_special_tokens_map_json": "asset/tokenizer/special_tokens_map.json",
    "sha256_asset_tokenizer_tokenizer_config_json": "asset/tokenizer/tokenizer_config.json",
    "sha256_asset_tokenizer_tokenizer_json": "asset/tokenizer/tokenizer.json",
}


def where_weights_go(weights_dir: Path) -> str:
    """Return the sentence that tells an operator where ChatTTS weights must be put."""
    return (
        f"put ChatTTS weights at {weights_dir}/asset/ (Vocos.safetensors, DVAE.safetensors, Decoder.safetensors, "
        f"Embed.safetensors, gpt/, tokenizer/) or a Hugging Face cache of 2Noise/ChatTTS at "
        f"{weights_dir / HF_SNAPSHOTS}/<revision>/"
    )


def find_weights(weights_dir: Path) -> tuple[str, Path]:
    """Return ChatTTS's ``source`` for ``weights_dir`` and the folder that holds its ``asset/``."""
    if (weights_dir / "asset").is_dir():
        return "custom", weights_dir
    snapshots = weights_dir / HF_SNAPSHOTS
    # ChatTTS itself picks the most recently modified snapshot; find the same one.
    revisions = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    if revisions and revisions[-1].is_dir():
        return "huggingface", revisions[-1]
    raise EngineLoadError(f"no ChatTTS weights in {weights_dir}: {where_weights_go(weights_dir)}")


def read_descriptor(root: Path) -> dict[str, Any] | None:
    """Return the random-weight model's descriptor under ``root``, or None for real weights."""
    for name in (DESCRIPTOR_NAME, LEGACY_DESCRIPTOR_NAME):
        path = root / name
        if path.is_file():
            data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return data
    return None


def descriptor_config(sizes: dict[str, Any]) -> Any:
    """Return a fresh ChatTTS Config with a descriptor's sizes replacing (never mutating) the defaults."""
    from ChatTTS.config import config as c

    cfg = c.Config()
    cfg.gpt = c.GPT(**sizes["gpt"])
    cfg.embed = c.Embed(**sizes["embed"])
    cfg.decoder = c.Decoder(**sizes["decoder"])
    dvae = sizes["dvae"]
    cfg.dvae = c.DVAE(
        encoder=c.Decoder(**dvae["encoder"]),
        decoder=c.Decoder(**dvae["decoder"]),
        vq=c.VQ(**dvae["vq"]),
    )
    vocos = sizes["vocos"]
    cfg.vocos = c.Vocos(
        feature_extractor=c.FeatureExtractor(),
        backbone=c.Backbone(init_args=c.BackboneInitArgs(**vocos["backbone"])),
        head=c.FourierHead(init_args=c.FourierHeadInitArgs(**vocos["head"])),
    )
    cfg.spk_stat = sizes["spk_stat"]
    return cfg
