"""Find sentence, clause, word and character boundaries in Chinese, English and mixed text."""

import itertools
import re
from collections.abc import Iterable, Iterator

from core.text.chars import CLOSERS, has_speakable, is_cjk, is_speakable, is_wide

SENTENCE_ENDS = frozenset("。！？!?；;")
CLAUSE_ENDS = frozenset("，,、：:…")
# Title-like abbreviations that are followed by a capitalised name; any other
# "word. lowercase" is already kept together by the lowercase rule below.
ABBREVIATIONS = frozenset(
    ("mr", "mrs", "ms", "mx", "dr", "prof", "sr", "jr", "st", "mt", "vs",
     "gen", "col", "capt", "lt", "sgt", "rev", "hon", "gov", "rep", "sen", "messrs")
)  # fmt: skip
_INITIALS = re.compile(r"[A-Z]|[A-Za-z](?:\.[A-Za-z])+")
_TAIL = SENTENCE_ENDS | CLAUSE_ENDS | frozenset(CLOSERS) | {"."}


def is_abbreviation(text: str, dot: int) -> bool:
    """Return whether the full stop at text[dot] ends an abbreviation or an initial."""
    start = dot
    while start > 0 and (text[start - 1] == "." or (text[start - 1].isascii() and text[start - 1].isalpha())):
        start -= 1
    token = text[start:dot].lstrip(".")
    return token.lower() in ABBREVIATIONS or _INITIALS.fullmatch(token) is not None


def _is_full_stop(text: str, i: int) -> bool:
    if text[i - 1 : i] == "." or text[i + 1 : i + 2] == ".":
        return False  # part of an ellipsis
    j = i + 1
    while j < len(text) and text[j] in CLOSERS:
        j += 1
    if j < len(text) and not (text[j].isspace() or is_wide(text[j])):
        return False  # 3.14, e.g, example.com
    return not is_abbreviation(text, i)


def _skip_tail(text: str, j: int) -> int:
    while j < len(text) and text[j] in _TAIL:
        j += 1
    while j < len(text) and text[j].isspace():
        j += 1
    return j


def _sentence_cuts(text: str) -> Iterator[int]:
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\n":
            i = _skip_tail(text, i)
            yield i
        elif ch in SENTENCE_ENDS or (ch == "." and _is_full_stop(text, i)):
            j = _skip_tail(text, i + 1)
            # "Stop!" she said. / "e.g. this": a lowercase word continues the sentence.
            if not (ch in ".!?" and j < len(text) and text[j].islower()):
                yield j
            i = j
        else:
            i += 1


def _clause_cuts(text: str) -> Iterator[int]:
    i = 0
    while i < len(text):
        between_digits = text[i - 1 : i].isdigit() and text[i + 1 : i + 2].isdigit()
        if (text[i] in CLAUSE_ENDS and not between_digits) or text.startswith("..", i):
            i = _skip_tail(text, i + 1)
            yield i
        else:
            i += 1


def _word_cuts(text: str) -> Iterator[int]:
    previous = -1
    for i, ch in enumerate(text):
        if not is_speakable(ch):
            continue
        if previous >= 0:
            gap = text[previous + 1 : i]
            spaces = [k for k, c in enumerate(gap) if c.isspace()]
            if spaces:
                yield previous + 2 + spaces[-1]  # opening quotes stay with their word
            elif is_cjk(ch) or is_cjk(text[previous]):
                yield i
        previous = i


def _char_cuts(text: str) -> Iterator[int]:
    speakable = [i for i, ch in enumerate(text) if is_speakable(ch)]
    return iter(speakable[1:])


def _cut(text: str, cuts: Iterable[int]) -> list[str]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(text)}), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if a < b]


def sentence_spans(text: str) -> list[str]:
    """Cut text after each sentence end; the pieces concatenate back to text."""
    return _cut(text, _sentence_cuts(text))


def clause_spans(text: str) -> list[str]:
    """Cut text after each comma, enumeration comma, colon or ellipsis."""
    return _cut(text, _clause_cuts(text))


def word_spans(text: str) -> list[str]:
    """Cut text between words and between CJK characters."""
    return _cut(text, _word_cuts(text))


def char_spans(text: str) -> list[str]:
    """Cut text before every speakable character."""
    return _cut(text, _char_cuts(text))


def merge_unspeakable(spans: Iterable[str]) -> list[str]:
    """Attach pieces with nothing to say to their neighbour, keeping order."""
    merged: list[str] = []
    carry = ""
    for span in spans:
        if has_speakable(span):
            merged.append(carry + span)
            carry = ""
        elif merged:
            merged[-1] += span
        else:
            carry += span
    return merged


def split_sentences(text: str) -> list[str]:
    """Split Chinese, English or mixed text into stripped, speakable sentences."""
    return [span.strip() for span in merge_unspeakable(sentence_spans(text))]
