"""The headline benchmark's arithmetic: engines measured side by side, and the batch size the service gets."""

from __future__ import annotations

from typing import Any

from bench.headline import combine_engines


def _engine(rates: dict[int, float]) -> dict[str, Any]:
    rows = [
        {"batch": b, "chars_per_s": r, "segments_per_s": r / 20, "audio_s_per_s": r / 8, "segments": 10, "seconds": 1.0}
        for b, r in rates.items()
    ]
    return {"model": "m", "rows": rows}


def test_engines_side_by_side_add_up_batch_size_by_batch_size() -> None:
    combined = combine_engines([_engine({1: 50, 8: 150, 16: 155}), _engine({1: 48, 8: 160, 16: 150})])
    assert combined["replicas"] == 2
    assert [r["chars_per_s"] for r in combined["rows"]] == [98, 310, 305]
    assert combined["best_batch"] == 8 and combined["best_chars_per_s"] == 310


def test_the_service_gets_the_smallest_batch_nearly_as_fast_as_the_best() -> None:
    assert combine_engines([_engine({1: 50, 8: 150, 16: 155})])["service_batch"] == 8  # 150 is within 5% of 155
    assert combine_engines([_engine({1: 50, 8: 120, 16: 155})])["service_batch"] == 16
