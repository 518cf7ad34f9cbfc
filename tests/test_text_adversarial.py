"""Adversarial texts at the longest length accepted: right answers, limits after normalisation.

No test here times anything (bench/text_adversarial.py does); each checks that a long run gives the
answer its short form gives, that the limits stop an expanding text, and that the shortcuts the
linear code takes (character tables, safe NFKC cuts) agree with the slow definitions they replace.
"""

from __future__ import annotations

import random
import re
import unicodedata

import pytest

from core.errors import TextOverLimit
from core.text import normalize, plan_segments
from core.text.clean import KEPT_RANGES, VISIBLE_RANGES, _is_invisible, _keeps
from core.text.limits import TextBudget
from core.text.normalize import (
    KEPT_LETTER_RANGES,
    MAX_MARKS_IN_A_ROW,
    NFKC_PIECE,
    NONSTARTER_CLASS,
    cap_marks,
    may_speak,
    nfkc,
    starts_fresh,
)

LONG = 20_000
CAPS = {"max_chars": 60, "first_max_chars": 24}


def _plan(text: str, language: str = "zh", **limits: int) -> list[str]:
    return plan_segments(text, language=language, **CAPS, **limits)  # type: ignore[arg-type]


def _at_least(error: TextOverLimit) -> int:
    found = re.search(r"at least ([\d,]+)", error.message)
    assert found is not None, error.message
    return int(found.group(1).replace(",", ""))


# --- long runs plan as their short forms do -------------------------------------------------


@pytest.mark.parametrize(
    ("run", "short"), [(" ", " "), ("\t", "\t"), ("\u3000", "\u3000"), (" \n", "\n\n"), ("\n", "\n\n")]
)
def test_a_run_of_twenty_thousand_spaces_plans_like_a_single_space(run: str, short: str) -> None:
    assert _plan("开始" + run * (LONG // len(run)) + "结束") == _plan("开始" + short + "结束")


@pytest.mark.parametrize(
    ("unit", "short"),
    [
        ("。.", "。."),
        ("-", "--"),
        (" -", " - "),
        (" )", " )"),
        ("…", "…"),
        ("...", "..."),
        ("!?。，、；", "!?。，、；"),
    ],
)
def test_a_long_run_of_marks_plans_like_a_short_one(unit: str, short: str) -> None:
    for language in ("zh", "en"):
        assert _plan("a" + unit * (LONG // len(unit)) + "b", language) == _plan("a" + short + "b", language)


def test_twenty_thousand_digits_are_read_one_by_one_into_capped_segments() -> None:
    segments = _plan("7" * LONG)
    assert "".join(segments) == "七" * LONG
    assert max(map(len, segments)) == CAPS["max_chars"]


def test_a_long_list_of_percentages_reads_each_one() -> None:
    assert normalize("1%" * (LONG // 2), language="zh") == "百分之一" * (LONG // 2)


def test_a_twenty_thousand_character_word_is_cut_by_characters() -> None:
    segments = _plan("a" * LONG, "en")
    assert "".join(segments) == "a" * LONG
    assert all(len(s) <= CAPS["max_chars"] for s in segments)


def test_chinese_without_punctuation_is_cut_between_characters() -> None:
    segments = _plan("中" * LONG)
    assert "".join(segments) == "中" * LONG
    assert len(segments) == len(_plan("7" * LONG))


@pytest.mark.parametrize("unit", ["Mr. ", "a.", "a ", "May "])
def test_repeated_words_and_dots_keep_every_letter(unit: str) -> None:
    text = unit * (LONG // len(unit))
    segments = _plan(text, "en")
    letters = re.sub(r"[^A-Za-z]", "", text)
    assert re.sub(r"[^A-Za-z]", "", "".join(segments)) == letters


# --- limits after normalisation ----------------------------------------------------------------


def test_an_expanding_text_is_refused_at_the_character_limit_long_before_it_is_expanded() -> None:
    with pytest.raises(TextOverLimit) as caught:
        _plan("\ufdfa" * LONG, max_total_chars=LONG)
    error = caught.value
    assert error.status == 413 and "TTS_MAX_TEXT_CHARS" in error.message
    # The whole text would be 360,000 characters; normalisation stopped after the first piece.
    assert LONG < _at_least(error) < 4 * LONG


@pytest.mark.parametrize("text", ["1 " * (LONG // 2), "1." * (LONG // 2), "\u3392" * LONG, "１" * LONG])
def test_texts_that_grow_past_the_limit_in_english_are_refused(text: str) -> None:
    with pytest.raises(TextOverLimit, match="TTS_MAX_TEXT_CHARS"):
        _plan(text, "en", max_total_chars=LONG)


def test_a_text_of_more_segments_than_the_limit_is_refused_naming_the_setting() -> None:
    with pytest.raises(TextOverLimit, match="TTS_MAX_SEGMENTS") as caught:
        _plan("字\n\n" * 3000, max_segments=2000)
    assert caught.value.details["limit"] == 2000


def test_limits_that_a_text_fits_change_none_of_its_segments() -> None:
    rng = random.Random(7)
    pieces = ["今天天气不错。", "Hello, world! ", "12.5%", "\n\n", "Dr. Smith ", "1990s", "😀", "……", "2024年5月1日"]
    for _ in range(50):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 200)))
        for language in ("zh", "en"):
            assert _plan(text, language, max_total_chars=LONG, max_segments=2000) == _plan(text, language)


@pytest.mark.parametrize("unit", ["!\n\n", "。\n\n", "😀\n\n", "\u200b\n\n"])
def test_thousands_of_paragraphs_with_nothing_to_say_plan_into_nothing(unit: str) -> None:
    assert _plan(unit * (LONG // len(unit)), max_total_chars=LONG, max_segments=2000) == []


def test_a_text_exactly_at_the_character_limit_is_accepted() -> None:
    text = "字" * LONG
    assert "".join(_plan(text, max_total_chars=LONG)) == text
    with pytest.raises(TextOverLimit):
        _plan(text + "字", max_total_chars=LONG)


def test_the_budget_counts_characters_across_paragraphs() -> None:
    budget = TextBudget(max_chars=10)
    budget.add_chars(6)
    with pytest.raises(TextOverLimit, match="at least 11 characters"):
        budget.add_chars(5)


# --- the shortcuts agree with the slow definitions ----------------------------------------------


def _code_points(ranges: tuple[tuple[int, int], ...]) -> list[str]:
    return [chr(c) for lo, hi in ranges for c in range(lo, hi + 1)]


def test_every_character_of_the_visible_ranges_is_visible() -> None:
    assert [ch for ch in _code_points(VISIBLE_RANGES) if _is_invisible(ch)] == []


def test_every_character_of_the_kept_ranges_is_kept() -> None:
    assert [ch for ch in _code_points(KEPT_RANGES) if not _keeps(ch)] == []


def test_the_kept_letters_are_letters_that_nothing_merges() -> None:
    jamo = re.compile("[\u1100-\u11ff\ua960-\ua97f\ud7b0-\ud7ff]")
    assert [ch for ch in _code_points(KEPT_LETTER_RANGES) if not ch.isalpha() or jamo.match(ch)] == []


def test_no_composition_makes_a_letter_or_digit_of_characters_that_are_none() -> None:
    # What may_speak relies on: a paragraph with no letter or digit even decomposed normalises to nothing.
    made = []
    for code in range(0x110000):
        decomposition = unicodedata.decomposition(chr(code))
        if decomposition and not decomposition.startswith("<") and chr(code).isalnum():
            parts = unicodedata.normalize("NFKD", "".join(chr(int(p, 16)) for p in decomposition.split()))
            if not any(part.isalnum() for part in parts):
                made.append(hex(code))
    assert made == []
    assert not may_speak("!?。😀\u200b—") and may_speak("℃") and may_speak("①")


def test_nfkc_is_never_cut_before_a_character_that_composes_with_the_one_before() -> None:
    # Every second character of a canonical composition: NFKC may not start a piece with one.
    seconds = set()
    for code in range(0x110000):
        decomposition = unicodedata.decomposition(chr(code))
        parts = decomposition.split()
        if len(parts) == 2 and not decomposition.startswith("<"):
            first, second = (chr(int(p, 16)) for p in parts)
            if unicodedata.normalize("NFC", first + second) == chr(code):
                seconds.add(second)
    seconds |= {chr(c) for c in range(0x1161, 0x1176)} | {chr(c) for c in range(0x11A8, 0x11C3)}  # Hangul V, T
    assert [hex(ord(ch)) for ch in sorted(seconds) if starts_fresh(ch)] == []


@pytest.mark.parametrize("pair", ["\u1100\u1161", "\uac00\u11a8", "e\u0301", "\u0b47\u0b3e", "\uff76\uff9e", "a\u0f73"])
def test_nfkc_in_pieces_is_nfkc_where_a_piece_would_end_inside_a_composition(pair: str) -> None:
    for offset in range(NFKC_PIECE - 3, NFKC_PIECE + 2):
        text = "\ufdfa" * offset + pair + "\u3392" * 100
        assert nfkc(text, TextBudget(max_chars=10**9)) == unicodedata.normalize("NFKC", text)


def test_nfkc_in_pieces_is_nfkc() -> None:
    rng = random.Random(11)
    composing = ["\u1100", "\u1161", "\u11a8", "\u0301", "\u0323", "a", "\u0b47", "\u0b3e", "\uff76", "\uff9e"]
    expanding = ["\ufdfa", "\u3392", "가", "\u0f73", "\u309b", "か", "①", " ", "\u0dd9", "\u0dcf", "\u0dca", "ﬃ"]
    for _ in range(40):
        alphabet = rng.choice([composing, composing + expanding])
        text = "".join(rng.choice(alphabet) for _ in range(6000))
        assert nfkc(text, TextBudget(max_chars=10**9)) == unicodedata.normalize("NFKC", text)


def test_a_run_of_twenty_thousand_combining_marks_keeps_only_the_first_thirty() -> None:
    # Unicode normalisation sorts a run of marks with an insertion sort: a long run would cost quadratic time.
    marks = "\u0301\u0316" * (LONG // 2)
    assert cap_marks("a" + marks + " b") == "a" + marks[:MAX_MARKS_IN_A_ROW] + " b"
    assert sum(map(len, _plan("开始" + "a" + marks + "结束"))) < 40


def test_characters_that_decompose_into_marks_are_capped_too() -> None:
    assert cap_marks("\u0f73" * LONG) == "\u0f73" * MAX_MARKS_IN_A_ROW
    assert _plan("开始" + "\u0f73" * LONG + "结束") == _plan("开始" + "\u0f73" * MAX_MARKS_IN_A_ROW + "结束")


def test_the_mark_class_holds_every_combining_mark_and_no_starter() -> None:
    nonstarters = re.compile(f"[{NONSTARTER_CLASS}]")
    for code in range(0x3000):
        ch = chr(code)
        first = unicodedata.normalize("NFKD", ch)[:1]
        expected = bool(unicodedata.combining(ch) or (first and unicodedata.combining(first)))
        assert bool(nonstarters.fullmatch(ch)) == expected, hex(code)
