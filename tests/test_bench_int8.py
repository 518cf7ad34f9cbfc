"""The int8 divergence bench's figures mean what its table says."""

from __future__ import annotations

import math

import numpy as np
import torch

from bench.int8_divergence import logit_figures, snr_db


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
