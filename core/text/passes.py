"""Run number patterns over a text: skip a pass that cannot match, try the rest only where they can start.

A pass is a pattern, the reader that says what a match becomes, a quick scan for what any match
needs, and where its matches can start. After unify_digits every decimal digit is ASCII, so the
scans here need know no other.
"""

import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from core.text.chars import context_language, is_cjk

Reader = Callable[[re.Match[str], str], str | None]
Starts = Callable[[str], Iterator[int]]

_DIGIT = re.compile("[0-9]")
_DIGIT_RUN = re.compile("[0-9][0-9]*")
_CURRENCY_SIGN = re.compile("[$€£¥]")
_PLUS = re.compile(r"\+")
# Past one candidate in this many characters, one regex scan beats a Python loop over them.
_SPARSE = 32


@dataclass(frozen=True)
class Pass:
    """One pattern to replace: what reads a match, what a text needs for a match, where matches start."""

    pattern: re.Pattern[str]
    reader: Reader
    hint: re.Pattern[str] | None = None
    starts: Starts | None = None


def run_starts(text: str) -> Iterator[int]:
    """Yield where each run of digits starts."""
    return (run.start() for run in _DIGIT_RUN.finditer(text))


def _signed(starts: Iterator[int], text: str) -> Iterator[int]:
    # A pattern that may begin with a minus sign is tried there first.
    for start in starts:
        if start and text[start - 1] == "-":
            yield start - 1
        yield start


def signed_run_starts(text: str) -> Iterator[int]:
    """Yield where each run of digits starts, and the minus sign before it."""
    return _signed(run_starts(text), text)


def signed_currency_starts(text: str) -> Iterator[int]:
    """Yield where each currency sign is, and the minus sign before it."""
    return _signed((sign.start() for sign in _CURRENCY_SIGN.finditer(text)), text)


def plus_starts(text: str) -> Iterator[int]:
    """Yield where each plus sign is."""
    return (plus.start() for plus in _PLUS.finditer(text))


def _needs_space(left: str, right: str) -> bool:
    return left.isalnum() and right.isalnum() and not (is_cjk(left) and is_cjk(right))


def _replace(match: re.Match[str], reader: Reader, lang: str) -> str:
    words = reader(match, lang)
    if words is None:
        return match.group(0)
    text, start, end = match.string, match.start(), match.end()
    if start and _needs_space(text[start - 1], words[0]):
        words = " " + words
    if end < len(text) and _needs_space(words[-1], text[end]):
        words += " "
    return words


def _replacer(reader: Reader, language: str, number_group: int | str) -> Callable[[re.Match[str]], str]:
    """Return a re.sub callback that reads each distinct match, in its surroundings, once."""
    # What a reading depends on: the language, the match, and (for the patterns' look-arounds, the
    # sign, 两 and ¥100元) at most two characters either side. A list of ten thousand numbers
    # then costs ten thousand lookups, not ten thousand readings.
    memo: dict[tuple[str, int, int, str], str] = {}

    def replace(match: re.Match[str]) -> str:
        text, start, end = match.string, match.start(), match.end()
        lang = context_language(text, *match.span(number_group)) if language == "auto" else language
        before = min(start, 2)
        key = (lang, before, end - start, text[start - before : end + 2])
        words = memo.get(key)
        if words is None:
            words = memo[key] = _replace(match, reader, lang)
        return words

    return replace


def substitute(pattern: re.Pattern[str], replace: Callable[[re.Match[str]], str], text: str, starts: list[int]) -> str:
    """Do pattern.sub(replace, text), trying the pattern only at starts (every place it can match)."""
    out: list[str] = []
    copied = 0
    for start in starts:
        if start < copied:
            continue  # inside a match already made, as re.sub would skip it
        match = pattern.match(text, start)
        if match is not None:
            out += (text[copied:start], replace(match))
            copied = match.end()
    if not out:
        return text
    out.append(text[copied:])
    return "".join(out)


def run_passes(text: str, passes: tuple[Pass, ...], *, language: str) -> str:
    """Apply each pass in order to text whose digits are ASCII, reading numbers in language."""
    for step in passes:
        if _DIGIT.search(text) is None:
            break  # every pass reads digits
        if step.hint is not None and step.hint.search(text) is None:
            continue
        replace = _replacer(step.reader, language, "n" if "n" in step.pattern.groupindex else 0)
        # Only a few candidates are worth a loop in Python: stop counting past them.
        most = len(text) // _SPARSE
        starts = [] if step.starts is None else list(itertools.islice(step.starts(text), most + 1))
        if step.starts is not None and len(starts) <= most:
            text = substitute(step.pattern, replace, text, starts)
        else:
            text = step.pattern.sub(replace, text)
    return text
