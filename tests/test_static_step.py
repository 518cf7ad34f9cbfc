"""The static key/value cache and its step: the same tokens as the growing loop, graphed or not, whatever joins."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from core.fragments import NO_FRAGMENTS, FragmentSchedule
from workers.engines import chattts_static, decode
from workers.engines.base import Piece, SynthesisRequest, Waveform
from workers.engines.chattts import ChatTTSEngine
from workers.engines.chattts_static import checked_static_step, disagreement_with_growing_loop
from workers.engines.static_cache import StaticCache
from workers.engines.static_step import Graphs, StaticStep, StepOutput, prepared_step

TEXTS = ["hello there", "a somewhat longer sentence, said slowly", "ok", "one of medium size", "and a fifth"]
VOICES = {"default": {"speaker_seed": 2}, "female": {"speaker_seed": 1111}}


def replayed(compute: Callable[[], StepOutput]) -> Callable[[], StepOutput]:
    """What stands in for ``cuda_graphs()`` on a CPU: the replay runs the captured step's code on the same buffers."""
    return compute


def make_engine(weights: Path, graphs: str, **options: object) -> ChatTTSEngine:
    engine = ChatTTSEngine(weights_dir=weights, device="cpu", voices=VOICES, max_tokens=120, **options)  # type: ignore[arg-type]
    engine.set_graphs(graphs)
    engine.load()
    return engine


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def growing(tiny_model_dir: Path) -> Iterator[ChatTTSEngine]:
    engine = make_engine(tiny_model_dir, "off")
    yield engine
    engine.unload()


@pytest.fixture(scope="module")
def static(tiny_model_dir: Path) -> Iterator[ChatTTSEngine]:
    engine = make_engine(tiny_model_dir, "on", static_rows=8, static_positions=256)
    yield engine
    engine.unload()


@pytest.fixture
def graphed(tiny_model_dir: Path) -> Iterator[ChatTTSEngine]:
    """An engine whose every bucket replays through the graphed path (padding rows, whole-width attention)."""
    engine = make_engine(tiny_model_dir, "on", static_rows=8, static_positions=256, fixed_token_budget=True)
    step, path = prepared_step(engine.chat.gpt, mode="on", rows=8, positions=256, capture=replayed)
    assert step is not None and sorted(step.graphs) == [(r, w) for r in (1, 2, 4, 8) for w in (128, 256)]
    assert path == "static cache, CUDA graphs for batch buckets 1,2,4,8 × widths 128,256"
    engine._static = step
    yield engine
    engine.unload()


def batch(*indices: int) -> list[SynthesisRequest]:
    voices = ["default", None, "female"]
    return [SynthesisRequest(TEXTS[i], voice=voices[i % 3], seed=10 + i) for i in indices]


def arriving(at: dict[int, list[SynthesisRequest]]) -> Callable[[], list[SynthesisRequest]]:
    asks: list[int] = []

    def arrivals() -> list[SynthesisRequest]:
        asks.append(len(asks))
        return at.get(len(asks) - 1, [])

    return arrivals


def made(engine: ChatTTSEngine, first: list[SynthesisRequest], at: dict[int, list[SynthesisRequest]]) -> list[Waveform]:
    return engine.synthesize_each(first, lambda index, wave: None, arriving(at))  # type: ignore[arg-type]


def assert_same(got: list[Waveform], expected: list[Waveform], *, rounding: float = 0.0) -> None:
    """Assert the same audio: exactly, or within float rounding (a different token would differ by far more)."""
    assert len(got) == len(expected)
    for wave, want in zip(got, expected, strict=True):
        assert len(wave) == len(want), "each item ended at the same step"
        np.testing.assert_allclose(wave, want, rtol=0, atol=rounding)


def test_the_static_step_makes_exactly_what_the_growing_loop_makes_as_items_end_at_their_own_steps(
    growing: ChatTTSEngine, static: ChatTTSEngine
) -> None:
    assert static.decode_path.startswith("static cache, eager step")
    assert growing.decode_path.startswith("growing cache")
    expected = growing.synthesize(batch(0, 1, 2, 3))
    assert len({len(w) for w in expected}) > 1, "the items end at different steps"
    assert_same(static.synthesize(batch(0, 1, 2, 3)), expected)


@pytest.mark.parametrize("ask", [1, 30])
def test_segments_that_join_take_free_rows_and_are_made_as_on_the_growing_loop(
    growing: ChatTTSEngine, static: ChatTTSEngine, ask: int
) -> None:
    # At the first ask the newcomers' prompts are longer than the rows' (the rows move right); by the 30th they
    # are shorter (the newcomers are padded).
    at = {ask: batch(1, 3), ask + 7: batch(4)}
    assert_same(made(static, batch(0, 2), at), made(growing, batch(0, 2), at))


def test_the_graphed_path_pads_each_batch_to_its_bucket_and_makes_the_same_tokens(
    graphed: ChatTTSEngine, tiny_model_dir: Path
) -> None:
    # Three rows run in bucket 4 (a padding row), then joins take them to 5 (bucket 8), then they end one by one.
    # Attention over the whole width sums the masked columns' zeros too: only float rounding differs.
    at = {3: batch(1, 4)}
    step = graphed.static_step
    assert step is not None
    used: set[tuple[int, int]] = set()
    for bucket, replay in list(step.graphs.items()):
        step.graphs[bucket] = lambda b=bucket, r=replay: (used.add(b), r())[1]  # type: ignore[misc]
    growing = make_engine(tiny_model_dir, "off", fixed_token_budget=True)
    try:
        assert_same(made(graphed, batch(0, 2, 3), at), made(growing, batch(0, 2, 3), at), rounding=1e-6)
    finally:
        growing.unload()
    assert {(4, 128), (8, 128)} <= used, "three rows padded to four, five to eight"
    assert {w for _, w in used} == {128, 256}, "wider steps as the rows grew longer"


def test_a_call_that_others_keep_joining_reuses_the_cache_columns_its_rows_no_longer_use(
    growing: ChatTTSEngine, tiny_model_dir: Path
) -> None:
    # 300 steps in a cache of 160 columns: only dropping what no row attends to any more makes room.
    engine = make_engine(tiny_model_dir, "on", static_rows=4, static_positions=160, fixed_token_budget=True)
    fixed = make_engine(tiny_model_dir, "off", fixed_token_budget=True)
    try:
        at = {n: [SynthesisRequest("ok", seed=n)] for n in range(20, 300, 20)}
        waves = made(engine, [SynthesisRequest("ok", seed=0)], at)
        assert len(waves) == 15
        assert_same(waves, made(fixed, [SynthesisRequest("ok", seed=0)], at))
    finally:
        engine.unload()
        fixed.unload()


def test_a_call_that_outgrows_the_static_cache_goes_on_on_a_growing_cache_with_the_same_tokens(
    growing: ChatTTSEngine, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine(tiny_model_dir, "on", static_rows=2, static_positions=256)
    try:
        at = {5: batch(1, 3)}  # four rows in a cache of two
        assert_same(made(engine, batch(0, 2), at), made(growing, batch(0, 2), at))
        assert engine.static_step is not None and engine.static_step.outgrown == 1
        assert "does not fit the static cache (2 × 256): it runs on the growing loop" in caplog.text
        too_long = make_engine(tiny_model_dir, "on", static_rows=8, static_positions=32)
        try:  # a prompt and its budget past the cache's columns never settle in it
            assert_same(too_long.synthesize(batch(0, 1)), growing.synthesize(batch(0, 1)))
            assert too_long.static_step is not None and too_long.static_step.outgrown == 1
        finally:
            too_long.unload()
    finally:
        engine.unload()


def test_fragments_are_cut_from_the_static_step_as_from_the_growing_loop(
    growing: ChatTTSEngine, static: ChatTTSEngine
) -> None:
    pieces: dict[str, list[tuple[int, Piece]]] = {"growing": [], "static": []}
    try:
        for name, engine in (("growing", growing), ("static", static)):
            engine.set_fragments(FragmentSchedule.parse("150,400"))
            engine.synthesize_each(batch(1, 3), lambda index, wave: None, None,
                                   lambda index, piece, name=name: pieces[name].append((index, piece)))  # type: ignore[misc]  # fmt: skip
    finally:
        growing.set_fragments(NO_FRAGMENTS)
        static.set_fragments(NO_FRAGMENTS)
    assert len(pieces["static"]) == len(pieces["growing"]) > 4, "each segment came in several fragments"
    for (index, piece), (want_index, want) in zip(pieces["static"], pieces["growing"], strict=True):
        assert (index, piece.number, piece.last) == (want_index, want.number, want.last)
        np.testing.assert_array_equal(piece.samples, want.samples)


@pytest.mark.parametrize(
    ("spoil", "why"),
    [(lambda logits: logits.flip(-1), "same tokens: False"), (lambda logits: logits / 0, "not finite")],
)
def test_a_graph_that_differs_from_the_eager_step_is_dropped_and_the_step_runs_eagerly(
    static: ChatTTSEngine, spoil: Callable[[torch.Tensor], torch.Tensor], why: str
) -> None:
    step = static.static_step
    assert step is not None

    def wrong(compute: Callable[[], StepOutput]) -> Callable[[], StepOutput]:
        def replay() -> StepOutput:
            hidden, logits = compute()
            return hidden, spoil(logits)

        return replay

    graphs = Graphs(step, tolerance=0.0)
    graphs.capture(wrong)
    assert step.graphs == {}
    assert graphs.path.startswith("static cache, eager step: bucket (1, 128)'s graph differs from the eager step")
    assert graphs.probes[0].ok is False and why in graphs.probes[0].detail


def test_a_capture_that_fails_leaves_the_step_eager_and_says_why(static: ChatTTSEngine) -> None:
    step = static.static_step
    assert step is not None

    def failing(compute: Callable[[], StepOutput]) -> Callable[[], StepOutput]:
        compute()
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs = Graphs(step, tolerance=0.0)
    graphs.capture(failing)
    assert step.graphs == {}
    assert graphs.path == (
        "static cache, eager step: capturing bucket (1, 128) failed: RuntimeError: operation not permitted when "
        "stream is capturing"
    )


def test_half_precision_graphs_are_held_to_a_logit_tolerance_not_to_identical_tokens(static: ChatTTSEngine) -> None:
    step = static.static_step
    assert step is not None

    def nudged(compute: Callable[[], StepOutput]) -> Callable[[], StepOutput]:
        def replay() -> StepOutput:
            hidden, logits = compute()
            return hidden, logits + 0.01

        return replay

    strict, loose = Graphs(step, tolerance=0.0), Graphs(step, tolerance=0.05)
    assert strict.probe((2, 256), nudged(lambda: step.compute(2, 256))).ok  # the same tokens
    assert loose.probe((2, 256), nudged(lambda: step.compute(2, 256))).ok
    assert not Graphs(step, tolerance=0.001).probe((2, 256), nudged(lambda: step.compute(2, 256))).ok


def test_graphs_are_off_on_a_cpu_unless_asked_and_an_unknown_setting_is_refused(static: ChatTTSEngine) -> None:
    gpt = static.chat.gpt
    assert prepared_step(gpt, mode="auto", rows=4, positions=64) == (
        None,
        "growing cache, eager step (graphs auto, no GPU)",
    )
    assert prepared_step(gpt, mode="off", rows=4, positions=64)[0] is None
    step, path = prepared_step(gpt, mode="on", rows=4, positions=64)
    assert isinstance(step, StaticStep) and step.buckets == [1, 2, 4]
    assert path == "static cache, eager step (no GPU to capture graphs on)"
    with pytest.raises(ValueError, match="graphs must be one of"):
        prepared_step(gpt, mode="sometimes", rows=4, positions=64)


def test_the_static_cache_is_counted_in_the_models_memory(growing: ChatTTSEngine, static: ChatTTSEngine) -> None:
    config = static.chat.gpt.gpt.config
    cache_mb = StaticCache.bytes_for(config, rows=8, positions=256, dtype=torch.float32) / 2**20
    assert cache_mb > 1
    assert static.memory_estimate_mb() - growing.memory_estimate_mb() == pytest.approx(cache_mb, abs=1)


def test_nan_left_in_the_cache_by_an_earlier_call_never_reaches_a_later_one(
    graphed: ChatTTSEngine, tiny_model_dir: Path
) -> None:
    step = graphed.static_step
    assert step is not None
    for layer in step.cache.static_layers:  # what an earlier call that overflowed in half precision might leave
        layer.key_buffer.fill_(float("nan"))
        layer.value_buffer.fill_(float("nan"))
    growing = make_engine(tiny_model_dir, "off", fixed_token_budget=True)
    try:  # rows taken, rows joined into padding rows' slots, columns dropped from the front
        at = {3: batch(1, 4)}
        assert_same(made(graphed, batch(0, 2, 3), at), made(growing, batch(0, 2, 3), at), rounding=1e-6)
    finally:
        growing.unload()


def test_a_static_step_that_differs_from_the_growing_loop_is_dropped_at_load(
    static: ChatTTSEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat = static.chat
    good, _ = prepared_step(chat.gpt, mode="on", rows=4, positions=128)
    assert good is not None and disagreement_with_growing_loop(chat, good) is None
    spoiled, _ = prepared_step(chat.gpt, mode="on", rows=4, positions=128)
    assert spoiled is not None
    compute = spoiled.compute

    def off_by_a_little(active: int, width: int) -> StepOutput:
        hidden, logits = compute(active, width)
        return hidden + 0.01 * hidden.abs().max(), logits

    monkeypatch.setattr(spoiled, "compute", off_by_a_little)
    monkeypatch.setattr(chattts_static, "prepared_step", lambda *args, **kwargs: (spoiled, "static cache, eager step"))
    step, path = checked_static_step(chat, mode="on", rows=4, positions=128)
    assert step is None
    assert path.startswith("growing cache, eager step (the static step differed from it: item 0's hidden states")


def test_the_static_step_needs_sdpa_attention_and_the_speech_code_pass(
    static: ChatTTSEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpt = static.chat.gpt
    monkeypatch.setattr(gpt.gpt.config, "_attn_implementation", "eager")
    assert prepared_step(gpt, mode="on", rows=4, positions=64) == (
        None, "growing cache, eager step (the static step needs SDPA attention, not eager)"
    )  # fmt: skip
    monkeypatch.undo()
    step, _ = prepared_step(gpt, mode="on", rows=4, positions=64)
    first = static.code_prompts(batch(0))
    with pytest.raises(ValueError, match="speech-code pass only"):
        decode.generate(gpt, first.emb, first.input_ids, first.attention_mask, temperature=torch.ones(1),
                        sampler=first.sampler, eos_token=0, max_new_token=4, infer_text=True, return_hidden=False,
                        static=step)  # fmt: skip
