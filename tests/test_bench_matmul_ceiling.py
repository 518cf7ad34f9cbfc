"""The matrix-maths ceiling's arithmetic: the most batching can buy, and what a shared step costs a first segment."""

from __future__ import annotations

import pytest

from bench.matmul_ceiling import ceilings, document


def _layouts() -> dict[tuple[int, int], dict[int, float]]:
    # Step times (s) by rows per replica: one host of two threads, and two hosts of one thread side by side.
    return {(2, 1): {1: 0.060, 8: 0.120, 16: 0.150}, (1, 2): {1: 0.065, 8: 0.140, 16: 0.180}}


def test_the_gain_ceiling_divides_the_best_batched_layout_by_the_best_layout_at_one_row() -> None:
    gain, slowdown, layout = ceilings(_layouts(), 16) or (0.0, 0.0, "")
    # Batch 1 is best with two hosts (2 / 0.065 tokens/s); 16 rows are best as 8 per host (16 / 0.140) over 16 / 0.150.
    assert layout == "1 × 2"
    assert gain == pytest.approx((16 / 0.140) / (2 / 0.065))
    assert slowdown == pytest.approx(0.140 / 0.065), "a step of 8 rows against one row, in the layout that won"


def test_callers_no_layout_can_spread_evenly_give_no_ceiling() -> None:
    assert ceilings({(1, 2): {1: 0.065, 8: 0.140}}, 5) is None
    assert ceilings({(1, 2): {1: 0.065, 8: 0.140}}, 32) is None, "16 rows a host were not measured"


def test_the_table_shows_every_row_count_and_the_ceilings_it_can_work_out() -> None:
    table = document(_layouts(), [1, 8, 16], steps=20, wall_s=30)
    assert "| 8 | 120 / 66.7 | 140 / 114.3 |" in table
    assert "| 16 | 3.71× |" in table and "| 32 | " in table, "32 callers: 16 rows on each of two hosts"
    assert "| 10 | " not in table, "neither 10 rows on one host nor 5 on each of two were measured"
