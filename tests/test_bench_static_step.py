"""The static-step bench's table: both paths at each batch size, on the same tokens (bench/static_step.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bench.static_step import PATHS, compare, document, load
from workers.engines.chattts import ChatTTSEngine

#: Texts of several lengths: at two tokens a character their budgets differ, so items end at their own steps.
TEXTS = ["你好。", "今天天气很好。", "我们一起去公园散步吧。", "明天早上八点我们在学校门口见面。"]


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path) -> Iterator[dict[str, ChatTTSEngine]]:
    """Return the tiny model loaded on each path, one torch thread (its ops are too small to share)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    loaded = {mode: load(tiny_model_dir, mode, rows=3, positions=256, tokens_per_char=2.0, max_tokens=40)
              for mode in PATHS}  # fmt: skip
    yield loaded
    for engine in loaded.values():
        engine.unload()
    torch.set_num_threads(threads)


def test_the_static_step_table_compares_both_paths_at_each_batch_on_identical_tokens(
    engines: dict[str, ChatTTSEngine],
) -> None:
    said: list[str] = []
    rows = compare(engines, TEXTS, [1, 3], repeats=2, say=said.append)
    assert [(r.batch, r.mode) for r in rows] == [(1, "off"), (1, "on"), (3, "off"), (3, "on")]
    assert len(said) == 2 * 2 * 2, "each path, each repeat, each batch"
    assert all(r.identical for r in rows), "the static step makes exactly the growing loop's tokens"
    for growing, static in zip(rows[::2], rows[1::2], strict=True):
        assert growing.tokens == static.tokens > 0, "fixed budgets: both paths make the same number of tokens"
        assert growing.ratio == 1.0 and static.ratio == pytest.approx(static.tokens_per_s / growing.tokens_per_s)
        assert static.step_ms > 0 and growing.step_ms > 0
    assert rows[0].decode_path.startswith("growing cache") and rows[1].decode_path.startswith("static cache")
    table = document(rows, {"model": "tiny", "threads": 1, "threads_why": "a test", "tokens_per_char": 2.0,
                            "max_tokens": 40, "rows": 3, "positions": 256, "repeats": 2, "wall_s": 1.0,
                            "load": 0.0})  # fmt: skip
    assert "| ms per step (median) | tokens/s | ratio static / growing | identical tokens |" in table
    for batch in (1, 3):
        for path in PATHS.values():
            assert f"| {batch} | {path} | " in table
    assert table.count("| yes |") == 4
    assert "At batch 3 the static step makes" in table
