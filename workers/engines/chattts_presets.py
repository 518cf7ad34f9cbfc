"""The sizes a random-weight ChatTTS is built at: tiny for tests, or ChatTTS's own (real) sizes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SizePreset:
    """One set of module sizes; ``vocab_size`` counts the tokenizer's entries before ChatTTS's 50 special tokens."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    layers: int
    vocab_size: int
    decoder: dict[str, int]
    dvae_encoder: dict[str, int]
    dvae_decoder: dict[str, int]
    vq_dim: int
    vocos_backbone: dict[str, int]
    vocos_head_dim: int

    def sizes(self, num_text_tokens: int, spk_stat: str) -> dict[str, Any]:
        """Return the sizes as the descriptor records them (what ChatTTS's Config must take to load the files)."""
        return {
            "gpt": {
                "hidden_size": self.hidden,
                "intermediate_size": self.intermediate,
                "num_attention_heads": self.heads,
                "num_hidden_layers": self.layers,
                "num_text_tokens": num_text_tokens,
            },
            "embed": {"hidden_size": self.hidden, "num_text_tokens": num_text_tokens},
            "decoder": dict(self.decoder),
            "dvae": {
                "encoder": dict(self.dvae_encoder),
                "decoder": dict(self.dvae_decoder),
                "vq": {"dim": self.vq_dim},
            },
            "vocos": {"backbone": dict(self.vocos_backbone), "head": {"dim": self.vocos_head_dim}},
            "spk_stat": spk_stat,
        }


def _layer(idim: int, odim: int, hidden: int, n_layer: int, bn_dim: int) -> dict[str, int]:
    return {"idim": idim, "odim": odim, "hidden": hidden, "n_layer": n_layer, "bn_dim": bn_dim}


TINY = SizePreset(
    name="tiny",
    hidden=64,
    intermediate=128,
    heads=4,
    layers=2,
    vocab_size=0,  # the small test vocabulary, whatever its length (chattts_vocab.py)
    decoder=_layer(32, 32, 32, 1, 16),
    dvae_encoder=_layer(32, 64, 32, 1, 16),
    dvae_decoder=_layer(32, 32, 32, 1, 16),
    vq_dim=64,
    vocos_backbone={"dim": 64, "intermediate_dim": 128, "num_layers": 1},
    vocos_head_dim=64,
)

#: ChatTTS 0.2.5's own sizes (ChatTTS/config/config.py): about 280M parameters, 1.1 GB in fp32.
FULL = SizePreset(
    name="full",
    hidden=768,
    intermediate=3072,
    heads=12,
    layers=20,
    vocab_size=21128,  # with the 50 special tokens, ChatTTS's 21178 text tokens
    decoder=_layer(384, 384, 512, 12, 128),
    dvae_encoder=_layer(512, 1024, 256, 12, 128),
    dvae_decoder=_layer(512, 512, 256, 12, 128),
    vq_dim=1024,
    vocos_backbone={"dim": 512, "intermediate_dim": 1536, "num_layers": 8},
    vocos_head_dim=512,
)

PRESETS = {preset.name: preset for preset in (TINY, FULL)}
