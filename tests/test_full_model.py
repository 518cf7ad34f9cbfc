"""The full-size random-weight ChatTTS: ChatTTS's own sizes and layout, its own registry entry, marked random.

Building it takes a gigabyte and a minute (`make full-model`), so these tests check what it is built from and
build only the tiny preset, through the same builder.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from core.registry import load_registry
from core.settings import load_settings
from tests.support.servers import ROOT
from workers.engines.chattts_assets import ASSET_FILES, DESCRIPTOR_NAME, read_descriptor
from workers.engines.chattts_presets import FULL, TINY
from workers.engines.chattts_random import FORMAT, _save_tokenizer, is_complete, main
from workers.engines.chattts_vocab import SPECIAL_TOKENS, vocabulary


def test_the_full_preset_has_chattts_own_sizes() -> None:
    from ChatTTS.config.config import Config

    real = Config()
    sizes = FULL.sizes(real.gpt.num_text_tokens, "")
    gpt = asdict(real.gpt)
    assert {k: gpt[k] for k in sizes["gpt"]} == sizes["gpt"]
    assert sizes["embed"]["hidden_size"] == real.embed.hidden_size
    assert sizes["decoder"] == asdict(real.decoder)
    assert sizes["dvae"]["encoder"] == asdict(real.dvae.encoder)
    assert sizes["dvae"]["decoder"] == asdict(real.dvae.decoder)
    assert sizes["dvae"]["vq"]["dim"] == real.dvae.vq.dim
    backbone = asdict(real.vocos.backbone.init_args)
    assert {k: backbone[k] for k in sizes["vocos"]["backbone"]} == sizes["vocos"]["backbone"]
    assert sizes["vocos"]["head"]["dim"] == real.vocos.head.init_args.dim


def test_the_full_tokenizer_has_chattts_text_vocabulary_size_and_spells_chinese(tmp_path: Path) -> None:
    from ChatTTS.config.config import Config
    from transformers import AutoTokenizer

    assert _save_tokenizer(tmp_path, FULL.vocab_size) == Config().gpt.num_text_tokens == 21178
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    ids = tokenizer.encode("今天天气很好", add_special_tokens=False)
    assert len(ids) == 6 and tokenizer.unk_token_id not in ids
    assert tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[0]) == FULL.vocab_size


def test_the_tiny_vocabulary_is_what_the_tiny_model_always_had() -> None:
    # Five BERT specials, a-z, ##a-##z and ten punctuation marks: 67, and 117 tokens with ChatTTS's 50.
    assert len(vocabulary(TINY.vocab_size)) == 67
    with pytest.raises(ValueError, match="at most"):
        vocabulary(10**6)


def test_a_built_model_is_marked_random_and_records_its_file_sizes(tmp_path: Path) -> None:
    assert main([str(tmp_path), "--preset", "tiny"]) == 0
    descriptor = read_descriptor(tmp_path)
    assert descriptor is not None
    assert (descriptor["format"], descriptor["random_weights"], descriptor["preset"]) == (FORMAT, True, "tiny")
    assert descriptor["bytes"] == {key: (tmp_path / rel).stat().st_size for key, rel in ASSET_FILES.items()}
    assert is_complete(tmp_path, preset="tiny") and not is_complete(tmp_path, preset="full")


def test_a_model_built_under_the_old_descriptor_name_still_reads_as_random_and_is_rebuilt(tmp_path: Path) -> None:
    main([str(tmp_path)])
    old = json.loads((tmp_path / DESCRIPTOR_NAME).read_text(encoding="utf-8"))
    (tmp_path / DESCRIPTOR_NAME).unlink()
    (tmp_path / "tiny_config.json").write_text(json.dumps({**old, "format": 1}), encoding="utf-8")
    assert read_descriptor(tmp_path) is not None
    assert not is_complete(tmp_path)
    main([str(tmp_path)])
    assert (tmp_path / DESCRIPTOR_NAME).is_file() and not (tmp_path / "tiny_config.json").exists()


def test_chattts_random_is_its_own_model_marked_random_and_never_pinned() -> None:
    raw = json.loads((ROOT / "models.json").read_text(encoding="utf-8"))["models"]
    random_model, real = raw["chattts-random"], raw["chattts"]
    assert random_model["random_weights"] is True and "random_weights" not in real
    assert random_model["engine"] == real["engine"], "loaded by the same code as real weights"
    assert random_model["precision"] == real["precision"]
    assert random_model["pinned"] is False, "a pinned 1.1 GB benchmark model would load in every worker"
    assert random_model["options"]["fixed_token_budget"] is True
    spec = load_registry(load_settings()).models["chattts-random"]
    assert spec.random_weights and spec.weights == ROOT / "models" / "chattts-random"
