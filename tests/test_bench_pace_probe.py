"""The machine-pace probe the benchmarks run between windows: a rate of fixed work, read against the run's first."""

from __future__ import annotations

import pytest
import torch

from bench.pace_probe import probe, relative


def test_the_probe_counts_rounds_of_work_per_second_and_gives_torch_back_its_thread_count() -> None:
    before = torch.get_num_threads()
    pace = probe(seconds=0.05, repeats=2)
    assert pace > 0
    assert torch.get_num_threads() == before, "the probe runs on one thread but must not change the caller's"


def test_a_pace_is_read_as_a_multiple_of_the_runs_first_probe_and_is_unknown_without_one() -> None:
    assert relative(600.0, 800.0) == pytest.approx(0.75)
    assert relative(600.0, None) is None
    assert relative(600.0, 0.0) is None
    assert relative(0.0, 800.0) is None
