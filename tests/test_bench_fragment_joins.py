"""The fragment-joins table on the tiny ChatTTS: the fragments of a wide window are the whole decode, a narrow one's
are not, and every row is measured at the whole decode's length."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.fragment_joins import (
    TOLERANCE,
    Joins,
    default_grid,
    document,
    full_grid,
    hidden_states,
    load,
    measure,
    recommend,
)
from workers.engines.chattts import ChatTTSEngine
from workers.engines.fragments import FragmentSizes, Window

TEXTS = ["早上好，今天天气不错。", "列车即将进站，请站稳扶好。"]
#: Small fragments, so that a short sentence has several joins.
SIZES = FragmentSizes(first=6, steady=10, least=5)
WINDOWS = [Window(0, 1), Window(8, 2, 256), Window(52, 52), Window(60, 60, 1024)]
Measured = tuple[ChatTTSEngine, list[torch.Tensor], dict[Window, Joins]]


@pytest.fixture(scope="module")
def measured(tiny_model_dir: Path) -> Iterator[Measured]:
    """Measure the test windows on the tiny model, on one torch thread (its ops are too small to share)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine, preset = load(tiny_model_dir)
        assert preset == "tiny", "the tiny model is random weights, which get their full token budget"
        hiddens = hidden_states(engine, TEXTS)
        rows = measure(hiddens, WINDOWS, engine.decode, SIZES)
        yield engine, hiddens, {r.window: r for r in rows}
    finally:
        torch.set_num_threads(threads)


def test_random_weights_make_every_segment_its_full_token_budget(measured: Measured) -> None:
    engine, hiddens, _ = measured
    assert [len(h) for h in hiddens] == [engine.token_budget(t) for t in TEXTS]


def test_a_window_wider_than_the_receptive_field_equals_the_whole_decode(measured: Measured) -> None:
    _, _, rows = measured
    for window in (Window(52, 52), Window(60, 60, 1024)):
        row = rows[window]
        assert row.max_abs <= TOLERANCE and row.equal, window
        assert row.snr_db > 60
        assert row.join_jump == pytest.approx(row.whole_jump_at_joins, abs=2 * TOLERANCE), "no click at the joins"


def test_every_window_joins_to_the_whole_decodes_length(measured: Measured) -> None:
    engine, hiddens, rows = measured
    whole = sum(len(engine.decode(h)) for h in hiddens)
    for row in rows.values():
        assert row.joined_samples == row.whole_samples == whole, row.window
        assert row.fragments > 2 * len(TEXTS), "each sentence is cut several times"


def test_a_window_without_context_or_lookahead_differs_far_more_than_a_wide_one(measured: Measured) -> None:
    _, _, rows = measured
    narrow, wide = rows[Window(0, 1)], rows[Window(52, 52)]
    assert narrow.max_abs > 100 * TOLERANCE > wide.max_abs
    assert narrow.mean_abs > wide.mean_abs
    assert narrow.snr_db < wide.snr_db
    assert not narrow.equal


def test_decode_work_counts_the_context_and_lookahead_decoded_again(measured: Measured) -> None:
    _, _, rows = measured
    narrow, wide = rows[Window(0, 1)], rows[Window(52, 52)]
    assert 1.0 <= narrow.work < wide.work
    # A 52-token window each side of every fragment of sentences this short covers most of the sentence each time.
    assert wide.work > 2.0


def test_the_recommended_window_is_the_cheapest_equal_one(measured: Measured) -> None:
    _, _, rows = measured
    best = recommend(list(rows.values()))
    assert best is not None and best.window == Window(52, 52)
    assert recommend([rows[Window(0, 1)]]) is None


def test_the_table_marks_which_rows_are_equal_and_names_the_recommendation(measured: Measured) -> None:
    _, hiddens, rows = measured
    text = document(list(rows.values()), model="chattts-tiny", preset="tiny", texts=TEXTS,
                    tokens=[len(h) for h in hiddens], sizes=SIZES, scales={"decoder": 1e-6}, wall_s=1.0)  # fmt: skip
    assert "| 0 | 1 | 0 |" in text and "| 52 | 52 | 0 |" in text
    assert text.count("| yes |") == 2 and text.count("| no |") == 2
    assert "**Recommended window on this model:** context 52, lookahead 52, crossfade 0" in text
    assert "random weights" in text and "smaller than trained weights'" in text


def test_the_grids_hold_only_windows_that_fit_and_cover_the_receptive_field() -> None:
    grid = default_grid()
    assert len(set(grid)) == len(grid)
    assert Window(0, 1) in grid and Window(52, 52) in grid
    assert all(w.crossfade <= w.lookahead * 512 - 256 for w in grid), "Window refuses a longer crossfade"
    assert Window(52, 1, 256) in grid
    assert (52, 1, 1024) not in {(w.context, w.lookahead, w.crossfade) for w in grid}
    assert len(full_grid()) > len(grid)


def test_an_exact_match_reads_as_an_infinite_snr() -> None:
    hidden = torch.from_numpy(np.random.default_rng(0).standard_normal((40, 2)).astype(np.float32))

    def pointwise(h: torch.Tensor) -> np.ndarray:
        # Each token's samples depend on that token alone: any window with lookahead is exact.
        samples = np.repeat(h[:, 0].numpy(), 512)
        return samples[: len(samples) - 256].astype(np.float32)

    [row] = measure([hidden], [Window(0, 1)], pointwise, SIZES)
    assert row.max_abs == 0 and math.isinf(row.snr_db) and row.equal
    # Context 0, lookahead 1: each window but the last decodes one token past its fragment, and nothing before it.
    assert 1.0 < row.work <= 1.0 + (row.fragments - 1) / 40
