"""Give punctuation the width of the script around it and tidy the spacing."""

import re

from core.text.chars import (
    CJK_CLASS,
    CLOSERS,
    OPENERS,
    WIDE_PUNCTUATION,
    is_cjk,
    is_word_letter,
    nearest_letter,
    script_weights,
)
from core.text.split import is_abbreviation

TO_WIDE = {",": "，", ".": "。", "!": "！", "?": "？", ";": "；", ":": "："}
TO_ASCII = {wide: narrow for narrow, wide in TO_WIDE.items()} | {"、": ","}
ELLIPSIS = "…"
_MARKS = "".join(TO_WIDE) + "".join(TO_ASCII) + ELLIPSIS
_ALL_PUNCTUATION = re.escape(_MARKS + OPENERS + CLOSERS + WIDE_PUNCTUATION)
_TIGHT = re.escape("，。！？；：、…「」『』《》〈〉【】〔〕")

_SPACE_BEFORE_CLOSER = re.compile(r"[^\S\n]+(?=[,.!?;:…)\]”’]|[" + _TIGHT + "])")
_SPACE_AFTER_OPENER = re.compile(r"(?<=[(\[“‘])[^\S\n]+")
_LEADING_MARKS = re.compile(r"^[" + re.escape(_MARKS) + r"\s]+", re.MULTILINE)
_ELLIPSES = re.compile(r"[.。]*(?:\.{2,}|。{2,}|…)[.。…]*")
_RUN = re.compile("[" + _ALL_PUNCTUATION + "]{2,}")
_SPACES = re.compile(r"[^\S\n]+")
_LINE_BREAK = re.compile(r" ?\n\s*")
_WIDE_GAP = re.compile(
    "(?<=[" + CJK_CLASS + _TIGHT + "]) (?=[" + CJK_CLASS + _TIGHT + "])|(?<=[" + _TIGHT + "]) | (?=[" + _TIGHT + "])"
)
_WORD_APOSTROPHE = re.compile(r"(?<=[^\W\d_])’(?=[^\W\d_])")
_MAX_RUN = 4
_MAX_ROUNDS = 4


def _squeeze(match: re.Match[str]) -> str:
    # "!!!" and "?？" say nothing more than one mark; long runs would also
    # let punctuation alone overflow a segment.
    seen: set[str] = set()
    kept = []
    for ch in match.group(0):
        key = TO_ASCII.get(ch, ch)
        if key not in seen:
            seen.add(key)
            kept.append(ch)
    return "".join(kept if len(kept) <= _MAX_RUN else kept[:2] + kept[-2:])


def _wants_wide(clause: str, text: str, i: int, language: str) -> bool:
    cjk, words = script_weights(clause)
    if cjk or words:
        return cjk >= words
    hit = nearest_letter(text, i - 1, -1) or nearest_letter(text, i + 1, 1)
    return is_cjk(hit[1]) if hit else language == "zh"


def _keeps_ascii(text: str, i: int) -> bool:
    # Dots inside "Node.js" or "e.g" and after "Mr" belong to the word.
    if text[i] != ".":
        return False
    inside_word = 0 < i < len(text) - 1 and is_word_letter(text[i - 1]) and is_word_letter(text[i + 1])
    return inside_word or is_abbreviation(text, i)


def _localize(text: str, language: str) -> str:
    out: list[str] = []
    clause_start = 0
    wide: bool | None = None
    for i, ch in enumerate(text):
        if ch not in _MARKS or _keeps_ascii(text, i):
            out.append(ch)
            continue
        clause = text[clause_start:i]
        # A mark right after another ("?!", "。」") takes the same width.
        if wide is None or any(c.isalpha() for c in clause):
            wide = _wants_wide(clause, text, i, language)
        if ch == ELLIPSIS:
            out.append("……" if wide else "...")
        elif wide:
            out.append(TO_WIDE.get(ch, ch))
        else:
            # "Hello，world" needs the space that full-width marks carry within them.
            spacer = " " if ch != "." and text[i + 1 : i + 2].isalnum() else ""
            out.append(TO_ASCII.get(ch, ch) + spacer)
        clause_start = i + 1
    return "".join(out)


def tidy_whitespace(text: str) -> str:
    """Collapse spaces, keep single line breaks and drop spaces CJK text does not use."""
    text = _SPACES.sub(" ", text)
    text = _LINE_BREAK.sub("\n", text.strip())
    text = _WIDE_GAP.sub("", text)
    text = _SPACE_BEFORE_CLOSER.sub("", text)
    return _SPACE_AFTER_OPENER.sub("", text)


def _tidy_once(text: str, language: str) -> str:
    text = tidy_whitespace(text)
    text = _LEADING_MARKS.sub("", text)
    text = _WORD_APOSTROPHE.sub("'", text)
    text = _ELLIPSES.sub(ELLIPSIS, text)
    text = _RUN.sub(_squeeze, text)
    return tidy_whitespace(_localize(text, language))


def tidy_punctuation(text: str, *, language: str) -> str:
    """Drop repeated and leading marks, give each mark its clause's width and tidy spaces."""
    # Dropping a space can bring two marks together, so repeat until stable
    # (normalising twice must give the same text as normalising once).
    for _ in range(_MAX_ROUNDS):
        tidied = _tidy_once(text, language)
        if tidied == text:
            break
        text = tidied
    return text
