"""A segment that must start now joins the ChatTTS call already running, in a real model host."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from core.policy import BatchTiming
from core.registry import ModelSpec
from tests.support.processes import wait_for
from workers.batcher import Batcher
from workers.engines.base import SynthesisRequest, Waveform
from workers.pool.handle import ModelHost
from workers.pool.pool import ModelPool

ESPEAK = ModelSpec(name="espeak-en", engine="espeak", voices={"default": ""}, options={"language": "en-us"})
#: About 1,000 tokens on the tiny model: seconds of decoding, long enough to join.
LONG = SynthesisRequest(text="a long sentence that takes a while to say, " * 4, seed=1)
SHORT = SynthesisRequest(text="a short one", seed=2)


@pytest.fixture
def tiny(tiny_model_dir: Path) -> ModelSpec:
    return ModelSpec(name="chattts-tiny", engine="chattts", weights=tiny_model_dir,
                     options={"fixed_token_budget": True, "max_tokens": 2048})  # fmt: skip


@pytest.fixture
def pool() -> Iterator[ModelPool]:
    made = ModelPool(lambda spec, _replica: ModelHost(spec, device="cpu", torch_threads=1), budget_mb=100_000,
                     idle_s=60, call_timeout_s=60)  # fmt: skip
    yield made
    made.close()


def _running_call(pool: ModelPool, name: str) -> ModelHost:
    """Wait until a host of ``name`` is in the middle of a call; return it."""
    host = wait_for(lambda: pool._hosts.get((name, 0)), 30, "the model host started")
    wait_for(lambda: host._call is not None, 30, "a call running on the host")
    return host


def test_a_host_refuses_a_join_when_no_call_runs_or_its_engine_cannot_take_one(
    pool: ModelPool, tiny: ModelSpec
) -> None:
    pool.synthesize(tiny, [SynthesisRequest(text="warm")])
    idle = pool.join(tiny, [SHORT], 0, ready=lambda index, wave, rate: None)
    assert idle.result(5) is False, "no call is running on the host"
    pool.synthesize(ESPEAK, [SynthesisRequest(text="warm")])
    host = pool._hosts[(ESPEAK.name, 0)]
    assert host.takes_arrivals is False and pool._hosts[(tiny.name, 0)].takes_arrivals is True


def test_an_urgent_segment_joins_the_running_call_and_is_made_before_it_ends(pool: ModelPool, tiny: ModelSpec) -> None:
    pool.synthesize(tiny, [SynthesisRequest(text="warm")])  # loaded: the call below starts at once
    batcher = Batcher(pool.synthesize, max_batch=8, max_wait_s=0.0, timing=BatchTiming(hold_s=0),
                      join_batch=pool.join)  # fmt: skip
    try:
        long: Future[tuple[Waveform, int]] = batcher.submit(tiny, LONG)
        _running_call(pool, tiny.name)
        short = batcher.submit(tiny, SHORT)  # due now: it cannot wait seconds for the long one to end
        wave, rate = short.result(30)
        assert not long.done(), "the short segment was made while the long call was still running"
        assert batcher.joined == 1 and batcher.batches == 0
        long_wave, _ = long.result(60)
        wait_for(lambda: batcher.batches == 1, 10, "one engine call made both")
    finally:
        batcher.close()
    alone, _ = pool.synthesize(tiny, [SHORT, LONG])
    np.testing.assert_allclose(wave, alone[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(long_wave, alone[1], rtol=0, atol=1e-5)
    assert rate == 24000


def test_without_joining_an_urgent_segment_waits_for_the_running_call(pool: ModelPool, tiny: ModelSpec) -> None:
    pool.synthesize(tiny, [SynthesisRequest(text="warm")])
    batcher = Batcher(pool.synthesize, max_batch=8, max_wait_s=0.0, timing=BatchTiming(hold_s=0))
    try:
        long = batcher.submit(tiny, LONG)
        _running_call(pool, tiny.name)
        short = batcher.submit(tiny, SHORT)
        short.result(60)
        assert long.done(), "it started only once the long call had ended"
        assert batcher.joined == 0
    finally:
        batcher.close()


@pytest.mark.parametrize("continues_a_stream", [False, True])
def test_a_call_making_a_playing_streams_due_segment_takes_another_streams_next_segment_but_no_first_one(
    pool: ModelPool, tiny: ModelSpec, continues_a_stream: bool
) -> None:
    pool.synthesize(tiny, [SynthesisRequest(text="warm")])
    batcher = Batcher(pool.synthesize, max_batch=8, max_wait_s=0.0, timing=BatchTiming(hold_s=0),
                      join_batch=pool.join)  # fmt: skip
    try:
        playing = batcher.submit(tiny, LONG, deadline=time.time(), early=True)  # its listener needs it now
        _running_call(pool, tiny.name)
        short = batcher.submit(tiny, SHORT, early=continues_a_stream)
        short.result(60)
        if continues_a_stream:  # its listener is playing too: it joins rather than wait for the call to end
            assert not playing.done() and batcher.joined == 1
        else:  # a newcomer waits rather than slow a stream already playing
            assert playing.done() and batcher.joined == 0
        playing.result(60)
    finally:
        batcher.close()
