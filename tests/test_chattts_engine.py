"""Tests of the ChatTTS engine: ChatTTS's real code path on the tiny random-weight model."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.servers import ROOT
from workers.engines import decode
from workers.engines.base import SynthesisRequest, Waveform
from workers.engines.chattts import ChatTTSEngine, speed_prompt
from workers.engines.chattts_presets import FULL, PRESETS, TINY
from workers.engines.chattts_random import build_random_model
from workers.engines.chattts_tiny import build_tiny_model, main, read_tiny_config
from workers.engines.errors import EngineLoadError, SynthesisError

VOICES = {"default": {"speaker_seed": 2}, "female": {"speaker_seed": 1111}}
TEXTS = ["hello there", "a somewhat longer sentence, said slowly", "ok", "one of medium size"]
MAX_TOKENS = 120
#: Vocos gives 256 samples per mel frame, two frames per token, less half a token at the edges.
SAMPLES_PER_TOKEN = 512


def make_engine(weights_dir: Path, **options: object) -> ChatTTSEngine:
    """Return a loaded engine on the CPU with the test voices and a small token cap."""
    settings: dict[str, object] = {"voices": VOICES, "max_tokens": MAX_TOKENS, **options}
    engine = ChatTTSEngine(weights_dir=weights_dir, device="cpu", **settings)  # type: ignore[arg-type]
    engine.load()
    return engine


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[ChatTTSEngine]:
    """Return an engine whose segments take exactly their token budget."""
    loaded = make_engine(tiny_model_dir, fixed_token_budget=True)
    yield loaded
    loaded.unload()


@pytest.fixture(scope="module")
def free_engine(tiny_model_dir: Path) -> Iterator[ChatTTSEngine]:
    """Return an engine whose segments end where the model stops them."""
    loaded = make_engine(tiny_model_dir)
    yield loaded
    loaded.unload()


def requests(**fields: object) -> list[SynthesisRequest]:
    """Return one request per test text with the given fields."""
    return [SynthesisRequest(text, **fields) for text in TEXTS]  # type: ignore[arg-type]


def alone(engine: ChatTTSEngine, request: SynthesisRequest) -> Waveform:
    """Synthesise one request in a batch of its own."""
    (waveform,) = engine.synthesize([request])
    return waveform


def tree_digest(root: Path) -> dict[str, str]:
    """Return the SHA-256 of every file under ``root``, by relative path."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def test_tiny_model_builds_deterministically(tmp_path: Path) -> None:
    first = tree_digest(build_tiny_model(tmp_path / "a"))
    assert first == tree_digest(build_tiny_model(tmp_path / "b"))
    other = tree_digest(build_tiny_model(tmp_path / "c", seed=1))
    assert other["asset/gpt/model.safetensors"] != first["asset/gpt/model.safetensors"]


def test_the_command_line_builds_once_and_then_skips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 0
    assert "built" in capsys.readouterr().out
    assert main([str(tmp_path)]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_a_batch_returns_one_waveform_per_segment(engine: ChatTTSEngine) -> None:
    waves = engine.synthesize(requests(voice="default"))
    assert len(waves) == len(TEXTS)
    for wave in waves:
        assert wave.dtype == np.float32
        assert wave.ndim == 1
        assert len(wave) > 0
        assert np.isfinite(wave).all()


def test_an_empty_batch_returns_no_waveforms(engine: ChatTTSEngine) -> None:
    assert engine.synthesize([]) == []


def test_a_fixed_budget_segment_lasts_exactly_its_token_budget(engine: ChatTTSEngine) -> None:
    for text in ("ok", "hello there", "x" * 200):
        budget = engine.token_budget(text)
        assert len(alone(engine, SynthesisRequest(text))) == SAMPLES_PER_TOKEN * budget - SAMPLES_PER_TOKEN // 2
    assert engine.token_budget("ok") == 24
    assert engine.token_budget("x" * 200) == MAX_TOKENS


@pytest.mark.parametrize("fixture", ["engine", "free_engine"])
def test_batched_segment_has_the_same_length_as_alone(fixture: str, request: pytest.FixtureRequest) -> None:
    chosen: ChatTTSEngine = request.getfixturevalue(fixture)
    batch = requests(voice="default")
    batched = chosen.synthesize(batch)
    assert [len(w) for w in batched] == [len(alone(chosen, r)) for r in batch]


def test_batched_segment_sounds_the_same_as_alone_whatever_its_batch_mates(free_engine: ChatTTSEngine) -> None:
    batch = [
        SynthesisRequest(TEXTS[0], voice="default", seed=3),
        SynthesisRequest(TEXTS[1], voice="female", seed=0, speed=1.3),
        SynthesisRequest(TEXTS[2], voice=None, seed=7),
        SynthesisRequest(TEXTS[3], voice="default", seed=3, speed=0.8),
    ]
    solo = [alone(free_engine, r) for r in batch]
    for order in (batch, batch[::-1]):
        for request, wave in zip(order, free_engine.synthesize(order), strict=True):
            expected = solo[batch.index(request)]
            # Tokens match exactly; only float rounding of the batched matmuls remains.
            np.testing.assert_allclose(wave, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("fixture", ["engine", "free_engine"])
@pytest.mark.parametrize("mode", ["balanced", "quality"])
def test_dropping_ended_items_from_the_batch_gives_what_chattts_own_loop_gives(
    fixture: str, mode: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen: ChatTTSEngine = request.getfixturevalue(fixture)
    batch = [SynthesisRequest(text, voice="default", seed=n, mode=mode) for n, text in enumerate(TEXTS)]
    ours = chosen.synthesize(batch)
    monkeypatch.setattr(decode, "supports", lambda gpt: False)  # ChatTTS's GPT.generate: every row to the end
    theirs = chosen.synthesize(batch)
    for mine, upstream in zip(ours, theirs, strict=True):
        assert len(mine) == len(upstream)
        np.testing.assert_allclose(mine, upstream, rtol=0, atol=1e-5)


def llama_inputs(engine: ChatTTSEngine, monkeypatch: pytest.MonkeyPatch, name: str, dim: int) -> list[int]:
    """Return a list that gets, at each call of the engine's Llama, the size of dimension ``dim`` of its ``name``."""
    llama = engine._chat.gpt.gpt  # type: ignore[union-attr]
    forward = llama.forward
    sizes: list[int] = []

    def measuring(*args: object, **kwargs: torch.Tensor) -> object:
        sizes.append(kwargs[name].size(dim))
        return forward(*args, **kwargs)

    monkeypatch.setattr(llama, "forward", measuring)
    return sizes


def test_an_item_leaves_the_batch_the_step_it_ends(engine: ChatTTSEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = llama_inputs(engine, monkeypatch, "inputs_embeds", 0)
    budgets = [engine.token_budget(text) for text in TEXTS]
    engine.synthesize(requests(voice="default"))
    assert len(set(budgets)) == len(TEXTS)
    # Each item runs its budget's steps and the one that ends it, and no more.
    assert rows == sorted(rows, reverse=True)
    assert sum(rows) == sum(b + 1 for b in budgets)
    assert sum(rows) < len(TEXTS) * (max(budgets) + 1)


def test_same_seed_gives_the_same_audio(engine: ChatTTSEngine) -> None:
    request = SynthesisRequest(TEXTS[1], voice="female", seed=42)
    np.testing.assert_array_equal(alone(engine, request), alone(engine, request))


def test_no_seed_gives_repeatable_audio(free_engine: ChatTTSEngine) -> None:
    request = SynthesisRequest(TEXTS[0], voice="default")
    np.testing.assert_array_equal(alone(free_engine, request), alone(free_engine, request))


def test_different_seeds_give_different_audio(engine: ChatTTSEngine) -> None:
    first = alone(engine, SynthesisRequest(TEXTS[1], seed=1))
    second = alone(engine, SynthesisRequest(TEXTS[1], seed=2))
    assert not np.allclose(first, second)


def test_voices_give_different_audio(engine: ChatTTSEngine) -> None:
    default = alone(engine, SynthesisRequest(TEXTS[1], voice="default"))
    female = alone(engine, SynthesisRequest(TEXTS[1], voice="female"))
    assert not np.allclose(default, female)


def test_a_spk_emb_voice_equals_the_speaker_seed_it_was_sampled_from(tiny_model_dir: Path) -> None:
    from ChatTTS.model import Speaker

    descriptor = read_tiny_config(tiny_model_dir)
    assert descriptor is not None
    speaker = Speaker(descriptor["sizes"]["gpt"]["hidden_size"], descriptor["sizes"]["spk_stat"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        embedding = speaker.sample_random()
    voices = {"seeded": {"speaker_seed": 7}, "given": {"spk_emb": embedding}}
    engine = make_engine(tiny_model_dir, voices=voices, fixed_token_budget=True)
    seeded = alone(engine, SynthesisRequest(TEXTS[0], voice="seeded"))
    np.testing.assert_array_equal(seeded, alone(engine, SynthesisRequest(TEXTS[0], voice="given")))


def test_an_unknown_voice_raises_a_synthesis_error(engine: ChatTTSEngine) -> None:
    with pytest.raises(SynthesisError, match="unknown ChatTTS voice 'nobody'"):
        engine.synthesize([SynthesisRequest(TEXTS[0], voice="nobody")])


def test_a_malformed_voice_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="speaker_seed"):
        ChatTTSEngine(weights_dir=tiny_model_dir, device="cpu", voices={"bad": {"seed": 1}})
    with pytest.raises(EngineLoadError, match="spk_emb"):
        make_engine(tiny_model_dir, voices={"bad": {"spk_emb": "not an embedding"}})


def test_speed_maps_to_the_speed_prompt() -> None:
    assert speed_prompt(1.0) == "[speed_5]"
    assert speed_prompt(0.6) == "[speed_3]"
    assert speed_prompt(1.5) == "[speed_8]"
    assert speed_prompt(0.0) == "[speed_0]"
    assert speed_prompt(4.0) == "[speed_9]"


def test_quality_mode_refines_the_text_first(free_engine: ChatTTSEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = free_engine._chat.tokenizer  # type: ignore[union-attr]
    encode, decode_ids = tokenizer.encode, tokenizer.decode
    encoded: list[list[str]] = []
    refined_texts: list[str] = []

    def encoding(prompts: list[str], *args: object, **kwargs: object) -> object:
        encoded.append(list(prompts))
        return encode(prompts, *args, **kwargs)

    def decoding(*args: object, **kwargs: object) -> object:
        texts = decode_ids(*args, **kwargs)
        refined_texts.extend(texts)
        return texts

    # Spies that call through: ChatTTS's own tokenizer still does the work.
    monkeypatch.setattr(tokenizer, "encode", encoding)
    monkeypatch.setattr(tokenizer, "decode", decoding)
    batch = [SynthesisRequest(TEXTS[0], mode="quality"), SynthesisRequest(TEXTS[0])]
    refined, plain = free_engine.synthesize(batch)
    refine_pass, code_pass = encoded
    # The refinement pass ran on the quality item alone, with ChatTTS's refine prompt around its text.
    assert len(refine_pass) == 1 and refine_pass[0].startswith("[Sbreak]") and TEXTS[0] in refine_pass[0]
    # Its output, not the text as sent, is what the speech pass spoke for that item; the other kept its text.
    (refined_text,) = refined_texts
    assert refined_text != TEXTS[0]
    speaker = free_engine._chat.speaker  # type: ignore[union-attr]
    spoken = [
        speaker.decorate_code_prompts([text], speed_prompt(1.0), None, None)[0] for text in (refined_text, TEXTS[0])
    ]
    assert code_pass == spoken
    assert refined.dtype == np.float32 and len(refined) > 0
    assert len(refined) != len(plain) or not np.allclose(refined, plain), "the refined text sounds different"
    np.testing.assert_allclose(plain, alone(free_engine, batch[1]), rtol=0, atol=1e-5)
    assert len(encoded) == 3, "a batch without a quality item makes no refinement pass"


def test_half_precision_runs_and_keeps_float32_output(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, precision="bf16", fixed_token_budget=True)
    wave = alone(engine, SynthesisRequest(TEXTS[0]))
    assert wave.dtype == np.float32
    assert len(wave) == SAMPLES_PER_TOKEN * engine.token_budget(TEXTS[0]) - SAMPLES_PER_TOKEN // 2


def test_missing_weights_raise_an_error_that_says_where_weights_go(tmp_path: Path) -> None:
    engine = ChatTTSEngine(weights_dir=tmp_path, device="cpu")
    with pytest.raises(EngineLoadError) as error:
        engine.load()
    assert f"{tmp_path}/asset/" in str(error.value)
    assert "models--2Noise--ChatTTS/snapshots" in str(error.value)


def test_a_hugging_face_cache_layout_loads_the_same_model(tmp_path: Path, engine: ChatTTSEngine) -> None:
    build_tiny_model(tmp_path / "models--2Noise--ChatTTS" / "snapshots" / "0123abcd")
    cached = make_engine(tmp_path, fixed_token_budget=True)
    request = SynthesisRequest(TEXTS[0], voice="female")
    np.testing.assert_array_equal(alone(cached, request), alone(engine, request))


def test_memory_estimate_counts_the_weights(tiny_model_dir: Path) -> None:
    engine = ChatTTSEngine(weights_dir=tiny_model_dir, device="cpu")
    before = engine.memory_estimate_mb()
    engine.load()
    assert before > 0
    assert abs(engine.memory_estimate_mb() - before) <= 1


def test_an_unloaded_engine_refuses_to_synthesize(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    engine.unload()
    with pytest.raises(SynthesisError, match="before load"):
        engine.synthesize([SynthesisRequest(TEXTS[0])])


def test_warming_up_compiles_the_text_code_chattts_would_otherwise_compile_mid_serving(tiny_model_dir: Path) -> None:
    """ChatTTS jit-compiles its tag splitting on the first text with a character it cannot speak: seconds."""
    probe = (
        "import sys; from ChatTTS import norm; from tests.test_chattts_engine import make_engine; "
        "from pathlib import Path; engine = make_engine(Path(sys.argv[1])); "
        "before = len(norm._split_tags.signatures) + len(norm._combine_tags.signatures); engine.warmup(); "
        "print(before, len(norm._split_tags.signatures), len(norm._combine_tags.signatures))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tiny_model_dir)],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, split, combine = map(int, done.stdout.split()[-3:])
    assert before == 0 and split >= 1 and combine >= 1


def test_each_segment_is_handed_over_the_step_it_ends_shortest_first(engine: ChatTTSEngine) -> None:
    told: list[tuple[int, Waveform]] = []
    waves = engine.synthesize_each(requests(voice="default"), lambda index, wave: told.append((index, wave)))
    budgets = [engine.token_budget(text) for text in TEXTS]
    # Each item ends at its own budget, so the short ones are handed over while the long ones are still made.
    assert [index for index, _ in told] == sorted(range(len(TEXTS)), key=budgets.__getitem__)
    for index, wave in told:
        np.testing.assert_array_equal(wave, waves[index])
    for wave, expected in zip(waves, engine.synthesize(requests(voice="default")), strict=True):
        np.testing.assert_array_equal(wave, expected)


def arriving(at: dict[int, list[SynthesisRequest]]) -> tuple[list[int], object]:
    """Return a log of the asks and an ``arrivals`` that hands over ``at[n]`` at the n-th ask (counted from 0)."""
    asks: list[int] = []

    def arrivals() -> list[SynthesisRequest]:
        asks.append(len(asks))
        return at.get(len(asks) - 1, [])

    return asks, arrivals


@pytest.mark.parametrize("ask", [1, 30])
def test_a_segment_that_joins_a_running_call_sounds_as_it_would_alone(free_engine: ChatTTSEngine, ask: int) -> None:
    # At the first ask the running rows' prompts are shorter than the newcomer's (they are moved); by the
    # 30th they are longer (the newcomer is padded). Either way only float rounding may differ.
    assert free_engine.takes_arrivals
    batch = [SynthesisRequest(TEXTS[0], voice="default", seed=3), SynthesisRequest(TEXTS[2], voice=None, seed=7)]
    late = [
        SynthesisRequest(TEXTS[1], voice="female", seed=0, speed=1.3),
        SynthesisRequest(TEXTS[3], voice="default", seed=5, mode="quality"),
    ]
    told: dict[int, Waveform] = {}
    asks, arrivals = arriving({ask: late})
    waves = free_engine.synthesize_each(batch, told.__setitem__, arrivals)  # type: ignore[arg-type]
    assert len(asks) > ask, "the call asked for arrivals between its steps"
    assert sorted(told) == [0, 1, 2, 3], "joined segments are numbered after the batch, in order"
    for index, request in enumerate(batch + late):
        np.testing.assert_array_equal(told[index], waves[index])
        np.testing.assert_allclose(waves[index], alone(free_engine, request), rtol=0, atol=1e-5)


def test_segments_join_at_different_steps_and_each_ends_at_its_own_budget(engine: ChatTTSEngine) -> None:
    asks, arrivals = arriving({2: [SynthesisRequest(TEXTS[1], seed=1)], 9: [SynthesisRequest(TEXTS[3], seed=2)]})
    first = [SynthesisRequest(TEXTS[2], seed=4)]
    waves = engine.synthesize_each(first, lambda index, wave: None, arrivals)  # type: ignore[arg-type]
    budgets = [engine.token_budget(text) for text in (TEXTS[2], TEXTS[1], TEXTS[3])]
    # A fixed budget: each lasts exactly its tokens, whenever it joined.
    assert [len(w) for w in waves] == [SAMPLES_PER_TOKEN * b - SAMPLES_PER_TOKEN // 2 for b in budgets]
    # The call went on past its first segment's end (ask 24) for those that joined, until the longest ended:
    # asks 0-2 (a join at 2), then one after each of its steps but the last.
    assert budgets[0] < len(asks) and len(asks) == 2 + budgets[1]


def test_a_call_that_others_keep_joining_attends_only_over_what_its_rows_still_use(
    engine: ChatTTSEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    widths = llama_inputs(engine, monkeypatch, "attention_mask", 1)
    # "ok" lasts 24 tokens; a new one joins every 20 steps, for 300 steps.
    asks, arrivals = arriving({n: [SynthesisRequest("ok", seed=n)] for n in range(20, 300, 20)})
    waves = engine.synthesize_each([SynthesisRequest("ok", seed=0)], lambda index, wave: None, arrivals)  # type: ignore[arg-type]
    assert len(waves) == 15 and len(asks) > 290
    # Without dropping the positions no row uses any more, the call would attend over all 300 steps and more.
    assert max(widths) < widths[0] + 2 * 24 + 20


def test_a_model_whose_text_ids_run_past_the_audio_vocabulary_speaks_with_the_repetition_penalty_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tiny model's 117 text tokens all have ids under the 626 audio tokens; ChatTTS's real ones (21,178) do not,
    # and its prompt's text ids sit in the repetition penalty's window for an item's first steps.
    wide = dataclasses.replace(TINY, name="tiny-wide", vocab_size=FULL.vocab_size)
    monkeypatch.setitem(PRESETS, "tiny-wide", wide)
    build_random_model(tmp_path, preset="tiny-wide")
    loaded = make_engine(tmp_path)
    try:
        waves = loaded.synthesize(
            [SynthesisRequest(text="今天天气很好", seed=3), SynthesisRequest(text="你好", seed=4)]
        )
    finally:
        loaded.unload()
    assert [w.size > 0 for w in waves] == [True, True]
