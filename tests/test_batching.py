"""The batcher groups concurrent segments by model and length, and never leaves a caller hanging."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from core.registry import ModelSpec
from workers.batcher import Batcher
from workers.batching import plan_batches
from workers.engines.base import SynthesisRequest, Waveform

SPEC = ModelSpec(name="m", engine="espeak")
OTHER = ModelSpec(name="other", engine="espeak")


def test_groups_hold_similar_lengths_and_respect_the_batch_size() -> None:
    lengths = [5, 100, 6, 7, 98, 50, 8, 9, 10, 11, 12, 13]
    groups = plan_batches(lengths, length=lambda n: n, max_batch=4, max_ratio=1.5, slack=0)
    assert sorted(n for g in groups for n in g) == sorted(lengths)
    for group in groups:
        assert len(group) <= 4
        assert max(group) <= 1.5 * min(group)


def test_the_group_with_the_oldest_item_comes_first() -> None:
    groups = plan_batches([100, 5, 6, 101], length=lambda n: n, max_batch=8, slack=0)
    assert groups == [[100, 101], [5, 6]]


def test_a_batch_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        plan_batches([1], length=lambda n: n, max_batch=0)


class RecordingEngine:
    """Stand-in engine call that records batch sizes and returns len(text) samples per item."""

    def __init__(self, delay_s: float = 0.05, fail: bool = False, short_by: int = 0) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.delay_s = delay_s
        self.fail = fail
        self.short_by = short_by
        self.lock = threading.Lock()

    def __call__(self, spec: ModelSpec, batch: list[SynthesisRequest]) -> tuple[list[Waveform], int]:
        with self.lock:
            self.calls.append((spec.name, [r.text for r in batch]))
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("engine exploded")
        waves = [np.full(len(r.text), 0.1, dtype=np.float32) for r in batch]
        return waves[: len(waves) - self.short_by], 16000


def _submit_concurrently(batcher: Batcher, specs_and_texts: list[tuple[ModelSpec, str]]) -> list[object]:
    with ThreadPoolExecutor(len(specs_and_texts)) as pool:
        futures = [
            pool.submit(lambda st: batcher.submit(st[0], SynthesisRequest(text=st[1])).result(5), st)
            for st in specs_and_texts
        ]
        results = []
        for f in futures:
            try:
                results.append(f.result())
            except Exception as e:
                results.append(e)
        return results


def test_concurrent_segments_of_one_model_share_an_engine_call() -> None:
    engine = RecordingEngine()
    batcher = Batcher(engine, max_batch=16, max_wait_s=0.05)
    texts = [f"sentence number {i:02d}" for i in range(16)]
    results = _submit_concurrently(batcher, [(SPEC, t) for t in texts])
    for text, (wave, rate) in zip(texts, results, strict=True):  # type: ignore[misc]
        assert len(wave) == len(text) and rate == 16000
    assert len(engine.calls) <= 3
    assert batcher.mean_batch_size() >= 5


def test_different_models_never_share_a_call() -> None:
    engine = RecordingEngine()
    batcher = Batcher(engine, max_batch=16, max_wait_s=0.05)
    _submit_concurrently(batcher, [(SPEC if i % 2 else OTHER, f"text {i}") for i in range(8)])
    for name, texts in engine.calls:
        expected_parity = 1 if name == "m" else 0
        assert all(int(t.split()[1]) % 2 == expected_parity for t in texts)


def test_a_failed_call_fails_every_segment_in_it_and_none_hangs() -> None:
    batcher = Batcher(RecordingEngine(fail=True), max_batch=8, max_wait_s=0.05)
    results = _submit_concurrently(batcher, [(SPEC, f"t{i}") for i in range(6)])
    assert all(isinstance(r, RuntimeError) and "exploded" in str(r) for r in results)


def test_a_call_that_returns_too_few_waveforms_fails_the_batch() -> None:
    batcher = Batcher(RecordingEngine(short_by=1), max_batch=8, max_wait_s=0.05)
    results = _submit_concurrently(batcher, [(SPEC, f"t{i}") for i in range(4)])
    assert all(isinstance(r, RuntimeError) and "waveforms for" in str(r) for r in results)


def test_a_failing_observer_neither_fails_the_batch_nor_stops_the_batcher() -> None:
    def broken_observer(*_: object) -> None:
        raise TypeError("observer bug")

    batcher = Batcher(RecordingEngine(), max_batch=4, max_wait_s=0.01, observe=broken_observer)
    first = _submit_concurrently(batcher, [(SPEC, "one"), (SPEC, "two")])
    second = _submit_concurrently(batcher, [(SPEC, "three")])
    assert all(not isinstance(r, Exception) for r in [*first, *second])


def test_first_segments_go_ahead_and_realtime_stays_ahead_of_batch() -> None:
    from celery_config import queue_keys, task_priority

    order = sorted([("batch", 0), ("realtime", 5), ("batch", 3), ("realtime", 0)], key=lambda t: task_priority(*t))
    assert order == [("realtime", 0), ("realtime", 5), ("batch", 0), ("batch", 3)]
    assert queue_keys("realtime")[0] == "realtime" and len(queue_keys("realtime")) == 4


def test_an_urgent_segment_rides_in_the_next_engine_call() -> None:
    engine = RecordingEngine(delay_s=0.2)
    batcher = Batcher(engine, max_batch=2, max_wait_s=0.0)
    blocker = batcher.submit(SPEC, SynthesisRequest(text="keeps the engine busy"))
    time.sleep(0.05)
    later = [batcher.submit(SPEC, SynthesisRequest(text=f"later segment {i}")) for i in range(4)]
    first = batcher.submit(SPEC, SynthesisRequest(text="first segment"), urgent=True)
    for future in (blocker, first, *later):
        future.result(5)
    assert "first segment" in engine.calls[1][1], engine.calls
