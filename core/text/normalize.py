"""Turn raw input text into text a TTS model can read aloud.

Declared boilerplate: the Unicode range tables here and in chars.py are data of one shape.
"""

import functools
import re
import unicodedata

from core.text.chars import has_speakable
from core.text.clean import drop_unspeakable, join_digit_groups, remove_invisible
from core.text.limits import TextBudget
from core.text.punctuation import tidy_punctuation
from core.text.verbalize import verbalize_numbers

LANGUAGES = ("auto", "zh", "en")

# NFKC expands some characters a lot (U+FDFA is 18 characters): with a budget it runs in
# pieces of about this many characters and stops as soon as the result is certain to be too long.
NFKC_PIECE = 2048
# Letters no later step removes or merges (no Hangul jamo, no compatibility forms): a lower
# bound on the length of the normalised text. tests/test_text_adversarial.py checks each is a letter.
KEPT_LETTER_RANGES: tuple[tuple[int, int], ...] = (
    (0x41, 0x5A),
    (0x61, 0x7A),
    (0xC0, 0xD6),
    (0xD8, 0xF6),
    (0xF8, 0x24F),
    (0x391, 0x3A1),
    (0x3A3, 0x3C9),
    (0x410, 0x44F),
    (0x5D0, 0x5EA),
    (0x620, 0x64A),
    (0x3041, 0x3096),
    (0x30A1, 0x30FA),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xAC00, 0xD7A3),
)
_KEPT_LETTER_CLASS = "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in KEPT_LETTER_RANGES)
_OTHER_THAN_KEPT_LETTERS = re.compile(f"[^{_KEPT_LETTER_CLASS}][^{_KEPT_LETTER_CLASS}]*")
_DIGITS = re.compile(r"\d\d*")
# The most letters one number can take away: "$5 thousand" is read 五千美元 (one character for eight letters).
LETTERS_PER_DIGIT_REMOVED = 8
# Where a character may compose with the one before it although it is a starter (Hangul jamo,
# Indic vowel signs): NFKC is only cut before characters outside these blocks.
_COMPOSING_BLOCKS = ((0x0900, 0x1DFF), (0x11000, 0x11FFF))


#: Most combining marks kept in a row (UAX #15's stream-safe limit). Unicode normalisation sorts each run
#: of marks with an insertion sort, so a long run costs quadratic time with the GIL held; no voice reads
#: thirty stacked marks, so the rest of a run is dropped.
MAX_MARKS_IN_A_ROW = 30
# Where a non-starter may come from: every character of the planes that have marks which is a combining
# mark itself or decomposes to one first (U+0F73 has class 0 but decomposes to two marks).
_MARK_PLANES = (range(0x20000), range(0xE0000, 0xE01F0))


def _mark_class() -> str:
    codes = [
        code
        for plane in _MARK_PLANES
        for code in plane
        if unicodedata.combining(chr(code))
        or (unicodedata.decomposition(chr(code)) and unicodedata.combining(unicodedata.normalize("NFKD", chr(code))[0]))
    ]
    ranges: list[tuple[int, int]] = []
    for code in codes:
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1] = (ranges[-1][0], code)
        else:
            ranges.append((code, code))
    return "".join(re.escape(chr(lo)) + ("-" + re.escape(chr(hi)) if hi > lo else "") for lo, hi in ranges)


NONSTARTER_CLASS = _mark_class()
_MARK_RUN = re.compile(f"[{NONSTARTER_CLASS}]{{{MAX_MARKS_IN_A_ROW + 1},}}")


def cap_marks(text: str) -> str:
    """Cut every run of combining marks to ``MAX_MARKS_IN_A_ROW``, so normalising the text stays linear."""
    return _MARK_RUN.sub(lambda run: run.group()[:MAX_MARKS_IN_A_ROW], text)


def kept_letters(text: str) -> int:
    """Count the letters of text that normalisation keeps: a lower bound on its normalised length."""
    return len(_OTHER_THAN_KEPT_LETTERS.sub("", text))


def _digit_count(text: str) -> int:
    return sum(map(len, _DIGITS.findall(text)))


@functools.lru_cache(maxsize=1 << 16)
def starts_fresh(ch: str) -> bool:
    """Return whether NFKC of a text may be cut just before ch (nothing before it composes with it)."""
    head = unicodedata.normalize("NFKD", ch)[0]
    code = ord(head)
    return unicodedata.combining(head) == 0 and not any(lo <= code <= hi for lo, hi in _COMPOSING_BLOCKS)


def _next_cut(text: str, at: int) -> int:
    while at < len(text) and not starts_fresh(text[at]):
        at += 1
    return at


def nfkc(text: str, budget: TextBudget | None = None) -> str:
    """Apply NFKC; with a budget, raise TextOverLimit as soon as the text is certain to be too long."""
    if unicodedata.is_normalized("NFKC", text):
        return text
    room = None if budget is None else budget.room()
    if budget is None or room is None:
        return unicodedata.normalize("NFKC", text)
    pieces: list[str] = []
    length = letters = digits = counted = start = 0
    while start < len(text):
        end = _next_cut(text, min(start + NFKC_PIECE, len(text)))
        pieces.append(unicodedata.normalize("NFKC", text[start:end]))
        length += len(pieces[-1])
        if length > room:  # only then can it be too long: count the letters sure to stay
            letters += sum(map(kept_letters, pieces[counted:]))
            digits += sum(map(_digit_count, pieces[counted:]))
            counted = len(pieces)
            # Only a number with a currency scale word loses letters (see LETTERS_PER_DIGIT_REMOVED).
            budget.expect_chars(max(0, letters - LETTERS_PER_DIGIT_REMOVED * digits))
        start = end
    return "".join(pieces)


def may_speak(text: str) -> bool:
    """Return whether normalising text can leave anything a voice reads (false: skip it, it would be empty)."""
    # Every letter or digit normalisation leaves comes from one in the decomposed text: numbers are
    # read as letters, symbols become spaces, and no composition makes a letter of non-letters.
    return has_speakable(text) or has_speakable(unicodedata.normalize("NFKD", cap_marks(text)))


def normalize(text: str, *, language: str = "auto", budget: TextBudget | None = None) -> str:
    """Clean text, spell its numbers in language and unify its punctuation.

    With a budget, raise TextOverLimit as soon as the result is certain to be longer than the
    characters left in it, before the expensive steps run on an input that expands.
    """
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {LANGUAGES}, got {language!r}")
    text = cap_marks(remove_invisible(text))
    text = join_digit_groups(text)
    text = nfkc(text, budget)
    text = verbalize_numbers(text, language=language)
    room = None if budget is None else budget.room()
    if budget is not None and room is not None and len(text) > room:
        budget.expect_chars(kept_letters(text))
    text = drop_unspeakable(text)
    text = tidy_punctuation(text, language=language)
    # Dropping spaces can join a combining mark to its letter ("チ ゙" → "ヂ").
    return unicodedata.normalize("NFC", text)
