"""The int8 divergence bench's figures mean what its table says."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.heard import character_error_rate, load_whisper, transcribe
from bench.int8_divergence import document, load, logit_figures, measure, snr_db


def test_identical_logits_diverge_by_nothing_and_share_every_top_code() -> None:
    logits = torch.randn(5, 4, 626, generator=torch.Generator().manual_seed(1))
    kl_mean, kl_max, overlap, top1 = logit_figures(logits, logits.clone(), topk=10)
    assert abs(kl_mean) < 1e-6 and abs(kl_max) < 1e-6
    assert overlap == 1.0 and top1 == 1.0


def test_logits_whose_ranking_is_reversed_share_no_top_code_and_diverge() -> None:
    logits = torch.arange(20, dtype=torch.float32).repeat(2, 1, 1)  # (steps, codebooks, codes)
    kl_mean, _, overlap, top1 = logit_figures(logits, -logits, topk=5)
    assert kl_mean > 1.0 and overlap == 0.0 and top1 == 0.0


def test_the_snr_of_audio_against_itself_is_infinite_and_halving_it_gives_six_db() -> None:
    wave = np.sin(np.linspace(0, 100, 24000)).astype(np.float32)
    assert math.isinf(snr_db(wave, wave.copy()))
    assert abs(snr_db(wave, wave / 2) - 6.02) < 0.01


def test_the_character_error_rate_counts_edits_per_character_and_ignores_punctuation() -> None:
    assert character_error_rate("你好，世界。", "你好世界") == 0.0
    assert character_error_rate("你好世界", "你好") == 0.5
    assert character_error_rate("你好世界", "你号世界啊") == 0.5
    assert character_error_rate("你好世界", "") == 1.0


@pytest.mark.slow
def test_whisper_hears_each_engines_own_speech_and_the_table_gains_both_error_rates(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    whisper = load_whisper(tmp_path / "whisper-base")
    fp32, int8 = load(tiny_model_dir, "fp32", fixed=True), load(tiny_model_dir, "int8", fixed=True)
    row = measure(fp32, int8, "今天天气很好。", 3, 10,
                  hear=lambda samples, rate: transcribe(whisper, samples, rate, language="zh"))  # fmt: skip
    assert row.heard_fp32 is not None and row.heard_int8 is not None
    assert row.cer_fp32 == character_error_rate(row.text, row.heard_fp32)
    assert row.cer_int8 == character_error_rate(row.text, row.heard_int8)
    table = document([row], model="tiny", preset="tiny", topk=10, wall_s=1.0, busy=0.0)
    assert "| CER fp32 | CER int8 |" in table and "compare the columns with each other" in table
