"""ChatTTS in fragments: they come while the batch decodes, and joined they are the segment's whole decode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from core.fragments import FragmentSchedule
from workers.engines.base import Piece, SynthesisRequest, Waveform
from workers.engines.chattts import ChatTTSEngine

VOICES = {"default": {"speaker_seed": 2}, "female": {"speaker_seed": 1111}}
TEXTS = ["今天天气很好，我们一起去公园散步吧", "你好", "一段中等长度的话，慢慢地说"]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[ChatTTSEngine]:
    """Return the tiny ChatTTS cutting fragments on the default schedule, each decoded the step it is complete."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    loaded = ChatTTSEngine(weights_dir=tiny_model_dir, device="cpu", voices=VOICES, max_tokens=240,
                           fixed_token_budget=True, fragment_context=16, fragment_lookahead=16,
                           fragment_first_lookahead=16, fragment_lead_s=0.0)  # fmt: skip
    loaded.load()
    loaded.set_fragments(FragmentSchedule.parse("250,400"))
    yield loaded
    loaded.unload()
    torch.set_num_threads(threads)


def _run(
    engine: ChatTTSEngine, batch: list[SynthesisRequest]
) -> tuple[list[list[Piece]], list[Waveform], list[tuple[str, int]]]:
    pieces: list[list[Piece]] = [[] for _ in batch]
    order: list[tuple[str, int]] = []

    def fragment(index: int, piece: Piece) -> None:
        pieces[index].append(piece)
        order.append(("fragment", index))

    def ready(index: int, wave: np.ndarray) -> None:
        order.append(("ready", index))

    waves = engine.synthesize_each(batch, ready, fragment=fragment)
    return pieces, waves, order


def test_fragments_join_into_the_waveform_and_equal_the_whole_decode(engine: ChatTTSEngine) -> None:
    batch = [SynthesisRequest(t, voice="default", seed=i) for i, t in enumerate(TEXTS)]
    pieces, waves, _ = _run(engine, batch)
    whole = [engine.decode(h) for h in engine.hidden_states(batch)]
    for made, wave, reference in zip(pieces, waves, whole, strict=True):
        assert [p.number for p in made] == list(range(len(made)))
        assert [p.last for p in made] == [False] * (len(made) - 1) + [True]
        np.testing.assert_array_equal(np.concatenate([p.samples for p in made]), wave)
        # With context and lookahead past the tiny model's receptive field, the joins are the whole decode's.
        np.testing.assert_allclose(wave, reference, rtol=0, atol=1e-4)
    assert len(pieces[0]) > 3


def test_a_long_segments_first_fragments_come_before_the_batch_ends(engine: ChatTTSEngine) -> None:
    batch = [SynthesisRequest(TEXTS[0], voice="default"), SynthesisRequest(TEXTS[2], voice="female")]
    _, _, order = _run(engine, batch)
    first_ready = order.index(next(e for e in order if e[0] == "ready"))
    assert {e[1] for e in order[:first_ready] if e[0] == "fragment"} == {0, 1}, "both streamed before either ended"


def test_a_segments_fragments_do_not_depend_on_its_batch_mates(engine: ChatTTSEngine) -> None:
    mine = SynthesisRequest(TEXTS[0], voice="default", seed=5)
    alone, _, _ = _run(engine, [mine])
    batched, _, _ = _run(engine, [SynthesisRequest(TEXTS[1], voice="female", seed=1), mine])
    assert [len(p.samples) for p in alone[0]] == [len(p.samples) for p in batched[1]]
    for a, b in zip(alone[0], batched[1], strict=True):
        np.testing.assert_allclose(a.samples, b.samples, rtol=0, atol=1e-5)


def test_a_segment_with_slack_is_decoded_once_and_still_cut_into_fragments(tiny_model_dir: Path) -> None:
    engine = ChatTTSEngine(weights_dir=tiny_model_dir, device="cpu", voices=VOICES, max_tokens=240,
                           fixed_token_budget=True)  # fmt: skip
    engine.load()
    engine.set_fragments(FragmentSchedule.parse("250,400"))
    decodes: list[int] = []
    decode = engine._decode

    def counted(chat: object, hidden: torch.Tensor) -> np.ndarray:
        decodes.append(len(hidden))
        return decode(chat, hidden)

    engine._decode = counted  # type: ignore[method-assign]
    pieces, waves, _ = _run(engine, [SynthesisRequest(TEXTS[0], voice="default", slack_s=30.0)])
    assert len(decodes) == 1 and len(pieces[0]) > 3
    np.testing.assert_array_equal(np.concatenate([p.samples for p in pieces[0]]), waves[0])
