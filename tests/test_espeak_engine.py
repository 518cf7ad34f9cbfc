"""Tests of the espeak-ng engine against the real library from the espeakng-loader wheel."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from workers.engines.base import SynthesisRequest, Waveform, every_one_made
from workers.engines.errors import EngineLoadError, SynthesisError
from workers.engines.espeak import EspeakEngine

VOICES = {"default": "", "female": "+f3", "male": "+m3"}
SENTENCES = {
    "cmn": "今天天气很好，我们一起去公园散步吧。",
    "yue": "今日天氣好好，我哋一齊去公園散步啦。",
    "en-us": "The quick brown fox jumps over the lazy dog today.",
}


def make_engine(language: str) -> EspeakEngine:
    """Return a loaded engine for one espeak-ng language with the usual voices."""
    engine = EspeakEngine(language=language, voices=VOICES)
    engine.load()
    return engine


def seconds(engine: EspeakEngine, waveform: Waveform) -> float:
    """Return a waveform's duration in seconds."""
    return len(waveform) / engine.sample_rate


def speak(engine: EspeakEngine, text: str, *, voice: str | None = None, speed: float = 1.0) -> Waveform:
    """Synthesise one request and return its waveform."""
    (waveform,) = engine.synthesize([SynthesisRequest(text=text, voice=voice, speed=speed)])
    return waveform


def test_engine_reports_the_library_sample_rate() -> None:
    assert make_engine("en-us").sample_rate == 22050


def test_a_batch_gives_one_mono_float32_waveform_per_request_in_order() -> None:
    engine = make_engine("en-us")
    texts = ["Hi.", "This sentence is a good deal longer than the first one.", "Bye."]
    waveforms = engine.synthesize([SynthesisRequest(text=text) for text in texts])

    assert len(waveforms) == len(texts)
    for waveform in waveforms:
        assert waveform.dtype == np.float32
        assert waveform.ndim == 1
        assert np.abs(waveform).max() <= 1.0
    assert len(waveforms[1]) > 3 * max(len(waveforms[0]), len(waveforms[2]))


def test_an_empty_batch_gives_no_waveforms() -> None:
    assert make_engine("en-us").synthesize([]) == []


@pytest.mark.parametrize("language", sorted(SENTENCES))
def test_each_language_gives_audible_speech_of_plausible_duration(language: str) -> None:
    engine = make_engine(language)
    waveform = speak(engine, SENTENCES[language])

    assert 0.3 < seconds(engine, waveform) < 10.0
    assert np.sqrt(np.mean(waveform**2)) > 0.01


def test_faster_speed_gives_shorter_audio() -> None:
    engine = make_engine("cmn")
    normal = speak(engine, SENTENCES["cmn"])
    fast = speak(engine, SENTENCES["cmn"], speed=2.0)

    assert len(fast) < 0.7 * len(normal)


def test_the_same_text_gives_the_same_audio_length_twice() -> None:
    # espeak-ng carries pitch-flutter phase between utterances, so samples are
    # not bit-identical; the duration is stable to a fraction of a percent.
    engine = make_engine("cmn")
    first = speak(engine, SENTENCES["cmn"])
    speak(engine, SENTENCES["en-us"])
    second = speak(engine, SENTENCES["cmn"])

    assert abs(len(first) - len(second)) <= 0.01 * len(first)


def test_voice_variants_change_the_audio() -> None:
    engine = make_engine("en-us")
    female = speak(engine, SENTENCES["en-us"], voice="female")
    male = speak(engine, SENTENCES["en-us"], voice="male")

    assert len(female) != len(male) or not np.array_equal(female, male)


def test_two_engines_with_different_languages_work_in_one_process() -> None:
    mandarin, english = make_engine("cmn"), make_engine("en-us")
    for _ in range(2):
        assert seconds(mandarin, speak(mandarin, SENTENCES["cmn"])) > 0.3
        assert seconds(english, speak(english, SENTENCES["en-us"])) > 0.3


def test_engines_called_from_two_threads_do_not_mix_their_audio() -> None:
    engines = {language: make_engine(language) for language in ("cmn", "en-us")}
    alone = {language: len(speak(engine, SENTENCES[language])) for language, engine in engines.items()}
    with ThreadPoolExecutor(max_workers=2) as pool:
        lengths = list(
            pool.map(
                lambda language: len(speak(engines[language], SENTENCES[language])),
                ["cmn", "en-us"] * 4,
            )
        )

    for language, length in zip(["cmn", "en-us"] * 4, lengths, strict=True):
        assert abs(length - alone[language]) <= 0.01 * alone[language]


@pytest.mark.parametrize("text", ["", "   \n\t"])
def test_empty_text_is_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="empty"):
        make_engine("en-us").synthesize([SynthesisRequest(text="Fine."), SynthesisRequest(text=text)])


def test_an_unknown_voice_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown voice"):
        speak(make_engine("en-us"), "Hello.", voice="whisperer")


@pytest.mark.parametrize("speed", [0.0, -1.0, float("nan")])
def test_a_non_positive_speed_is_rejected(speed: float) -> None:
    with pytest.raises(ValueError, match="speed"):
        speak(make_engine("en-us"), "Hello.", speed=speed)


def test_loading_an_unknown_language_fails() -> None:
    with pytest.raises(EngineLoadError, match="no voice"):
        EspeakEngine(language="xx-nowhere", voices=VOICES).load()


def test_synthesizing_before_load_fails() -> None:
    with pytest.raises(SynthesisError, match="before load"):
        EspeakEngine(language="en-us", voices=VOICES).synthesize([SynthesisRequest(text="Hi.")])


def test_an_engine_without_its_own_hand_over_tells_every_item_once_its_batch_is_made() -> None:
    engine = make_engine("en-us")
    told: list[tuple[int, int]] = []
    batch = [SynthesisRequest(text="one"), SynthesisRequest(text="two three")]
    waves = engine.synthesize_each(batch, lambda index, wave: told.append((index, len(wave))))
    assert told == [(0, len(waves[0])), (1, len(waves[1]))]


def test_a_slot_no_item_filled_is_a_synthesis_error_naming_it() -> None:
    made = np.zeros(4, dtype=np.float32)
    assert every_one_made([made, made], what="engine") == [made, made]
    with pytest.raises(SynthesisError, match=r"no waveform for input\(s\) \[1\] of 3"):
        every_one_made([made, None, made], what="engine")
