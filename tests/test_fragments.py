"""Fragments of a segment's audio: their sizes follow the schedule, and joined they are the whole decode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workers.engines.fragments import (
    DECODE_SHORTFALL,
    SAMPLES_PER_TOKEN,
    WHOLE,
    FragmentSchedule,
    FragmentSizes,
    TokenFragments,
    Window,
)

#: Each token's samples depend on its neighbours up to this far away, as the decoder's convolutions make them.
FIELD = 3


def convolution_decode(hidden: torch.Tensor) -> np.ndarray:
    """Decode as a non-causal convolution would: each token's samples mix the tokens within ``FIELD`` of it."""
    values = hidden[:, 0].double().numpy()
    padded = np.pad(values, FIELD)
    mixed = np.array([padded[i : i + 2 * FIELD + 1] @ np.linspace(1, 2, 2 * FIELD + 1) for i in range(len(values))])
    ramp = np.linspace(0, 1, SAMPLES_PER_TOKEN, endpoint=False)
    samples = (mixed[:, None] * (1 + ramp)).reshape(-1)
    return samples[: max(0, len(samples) - DECODE_SHORTFALL)].astype(np.float32)


def tokens(count: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(count).standard_normal((count, 4)).astype(np.float32))


def fragments_of(hidden: torch.Tensor, sizes: FragmentSizes, window: Window) -> list[np.ndarray]:
    """Feed ``hidden`` one token at a time, as a decode loop does, then end it."""
    cutter = TokenFragments(sizes, window, convolution_decode)
    made = []
    for length in range(1, len(hidden)):
        made += cutter.grown(hidden.narrow(0, 0, length))
    return made + cutter.ended(hidden)


SIZES = FragmentSizes(first=12, steady=19, least=10)


@pytest.mark.parametrize("count", [1, 5, 12, 20, 21, 22, 31, 40, 60, 97, 144, 300])
def test_fragments_joined_equal_the_whole_decode_when_the_window_covers_the_field(count: int) -> None:
    hidden = tokens(count)
    made = fragments_of(hidden, SIZES, Window(context=FIELD, lookahead=FIELD))
    np.testing.assert_array_equal(np.concatenate(made), convolution_decode(hidden))


@pytest.mark.parametrize("count", [40, 97, 144, 300])
def test_after_the_first_every_fragment_is_between_least_and_steady(count: int) -> None:
    made = fragments_of(tokens(count), SIZES, Window(context=4, lookahead=8))
    lengths = [len(m) for m in made]
    assert lengths[0] == SIZES.first * SAMPLES_PER_TOKEN
    for length in lengths[1:-1]:
        assert SIZES.least * SAMPLES_PER_TOKEN <= length <= SIZES.steady * SAMPLES_PER_TOKEN
    assert SIZES.least * SAMPLES_PER_TOKEN - DECODE_SHORTFALL <= lengths[-1] <= SIZES.steady * SAMPLES_PER_TOKEN


def test_a_fragment_waits_only_for_its_lookahead() -> None:
    cutter = TokenFragments(SIZES, Window(context=4, lookahead=5), convolution_decode)
    hidden = tokens(40)
    assert cutter.grown(hidden.narrow(0, 0, SIZES.first + 4)) == []
    [first] = cutter.grown(hidden.narrow(0, 0, SIZES.first + 5))
    assert len(first) == SIZES.first * SAMPLES_PER_TOKEN


def test_with_fragments_off_a_segment_is_one_fragment_of_the_whole_decode() -> None:
    hidden = tokens(97)
    made = fragments_of(hidden, WHOLE, Window())
    assert len(made) == 1
    np.testing.assert_array_equal(made[0], convolution_decode(hidden))


def test_a_short_window_differs_from_the_whole_decode_only_near_the_joins() -> None:
    hidden = tokens(144)
    joined = np.concatenate(fragments_of(hidden, SIZES, Window(context=1, lookahead=1)))
    whole = convolution_decode(hidden)
    assert joined.shape == whole.shape
    assert not np.array_equal(joined, whole)
    np.testing.assert_array_equal(joined[: SIZES.first * SAMPLES_PER_TOKEN // 2], whole[: SIZES.first * 256])


def test_a_crossfade_keeps_the_length_and_blends_only_the_fragment_starts() -> None:
    hidden = tokens(144)
    fade = FIELD * SAMPLES_PER_TOKEN
    plain = fragments_of(hidden, SIZES, Window(context=FIELD, lookahead=2 * FIELD))
    faded = fragments_of(hidden, SIZES, Window(context=FIELD, lookahead=2 * FIELD, crossfade=fade))
    assert [len(f) for f in faded] == [len(p) for p in plain]
    # With the whole field in view of both windows, they decode the blended samples alike: the fade changes nothing.
    np.testing.assert_allclose(np.concatenate(faded), np.concatenate(plain), rtol=1e-6, atol=1e-6)


def test_the_schedule_in_milliseconds_becomes_tokens() -> None:
    sizes = FragmentSchedule.parse("250,400").in_tokens(512 / 24)
    assert sizes == FragmentSizes(first=12, steady=19, least=10)
    assert FragmentSchedule.parse("150,400").in_tokens(512 / 24) == FragmentSizes(first=7, steady=19, least=10)
    assert not FragmentSchedule.parse("off").streams
    assert FragmentSchedule.parse("off").in_tokens(21.3) == WHOLE


@pytest.mark.parametrize("text", ["250", "0,400", "250,100,300", "a,b"])
def test_a_malformed_schedule_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        FragmentSchedule.parse(text)


def test_a_window_without_lookahead_is_refused() -> None:
    with pytest.raises(ValueError):
        Window(lookahead=0)


def test_while_its_listener_is_well_ahead_fragments_are_decoded_several_at_a_time() -> None:
    calls: list[int] = []

    def counted(hidden: torch.Tensor) -> np.ndarray:
        calls.append(len(hidden))
        return convolution_decode(hidden)

    hidden = tokens(300)
    still = 0.0  # a clock that stands still: an engine far faster than real time
    cutter = TokenFragments(SIZES, Window(context=FIELD, lookahead=FIELD), counted, lead_s=1.0,
                            clock=lambda: still)  # fmt: skip
    made = []
    for length in range(1, len(hidden)):
        made += cutter.grown(hidden.narrow(0, 0, length))
    made += cutter.ended(hidden)
    np.testing.assert_array_equal(np.concatenate(made), convolution_decode(hidden))
    assert all(SIZES.least * SAMPLES_PER_TOKEN - DECODE_SHORTFALL <= len(m) for m in made[1:])
    assert len(calls) < len(made) / 2, "most decodes made several fragments"


def test_a_segment_needed_only_later_is_decoded_once_and_cut_into_fragments() -> None:
    calls: list[int] = []

    def counted(hidden: torch.Tensor) -> np.ndarray:
        calls.append(len(hidden))
        return convolution_decode(hidden)

    hidden = tokens(144)
    cutter = TokenFragments(SIZES, Window(context=FIELD, lookahead=FIELD), counted, lead_s=1.0, slack_s=5.0,
                            clock=lambda: 0.0)  # fmt: skip
    made = []
    for length in range(1, len(hidden)):
        made += cutter.grown(hidden.narrow(0, 0, length))
    made += cutter.ended(hidden)
    assert calls == [144]
    assert len(made[0]) == SIZES.steady * SAMPLES_PER_TOKEN and len(made) > 5, "no short first: nobody waits"
    np.testing.assert_array_equal(np.concatenate(made), convolution_decode(hidden))


def test_a_listener_short_of_audio_gets_each_fragment_the_step_it_is_complete() -> None:
    hidden = tokens(120)
    now = [0.0]
    cutter = TokenFragments(SIZES, Window(context=4, lookahead=4), convolution_decode, lead_s=1.0,
                            clock=lambda: now[0])  # fmt: skip
    for length in range(1, len(hidden)):
        now[0] += 0.5  # an engine slower than real time: a token takes longer than it lasts
        for fragment in cutter.grown(hidden.narrow(0, 0, length)):
            assert len(fragment) in (SIZES.first * SAMPLES_PER_TOKEN, SIZES.steady * SAMPLES_PER_TOKEN)
    assert cutter.count == 1 + (120 - SIZES.first - SIZES.least) // SIZES.steady


def test_a_segment_whose_listener_is_playing_starts_with_a_steady_fragment() -> None:
    made = fragments_of_opening(tokens(97), opening=False)
    assert len(made[0]) == SIZES.steady * SAMPLES_PER_TOKEN
    assert len(fragments_of_opening(tokens(97), opening=True)[0]) == SIZES.first * SAMPLES_PER_TOKEN


def fragments_of_opening(hidden: torch.Tensor, *, opening: bool) -> list[np.ndarray]:
    cutter = TokenFragments(SIZES, Window(context=FIELD, lookahead=FIELD), convolution_decode, opening=opening)
    made = []
    for length in range(1, len(hidden)):
        made += cutter.grown(hidden.narrow(0, 0, length))
    return made + cutter.ended(hidden)


def test_the_first_fragment_may_look_ahead_less_than_the_rest() -> None:
    cutter = TokenFragments(SIZES, Window(context=FIELD, lookahead=8, first_lookahead=2), convolution_decode)
    hidden = tokens(80)
    assert cutter.grown(hidden.narrow(0, 0, SIZES.first + 1)) == []
    assert len(cutter.grown(hidden.narrow(0, 0, SIZES.first + 2))) == 1
    made = fragments_of(hidden, SIZES, Window(context=FIELD, lookahead=FIELD, first_lookahead=FIELD))
    np.testing.assert_array_equal(np.concatenate(made), convolution_decode(hidden))


def test_only_a_job_opening_fragment_looks_ahead_less() -> None:
    window = Window(context=FIELD, lookahead=8, first_lookahead=2)
    hidden = tokens(80)
    playing = TokenFragments(SIZES, window, convolution_decode, opening=False)
    assert playing.grown(hidden.narrow(0, 0, SIZES.steady + 7)) == []
    assert len(playing.grown(hidden.narrow(0, 0, SIZES.steady + 8))) == 1
