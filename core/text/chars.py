"""Classify characters by script and by whether a voice can speak them.

Declared boilerplate: the Unicode range tables here and in normalize.py are data of one shape.
"""

import re
from collections.abc import Callable

# Han ideographs, kana and the two CJK letters that are not in the Han blocks
# (々 iteration mark, 〇 zero): the scripts written without spaces and with
# full-width punctuation.
CJK_RANGES: tuple[tuple[int, int], ...] = (
    (0x3005, 0x3005),
    (0x3007, 0x3007),
    (0x3040, 0x30FF),
    (0x31F0, 0x31FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xF900, 0xFAFF),
    (0x20000, 0x3134F),
)
CJK_CLASS = "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in CJK_RANGES)
_CJK = re.compile(f"[{CJK_CLASS}]")
# str.isalnum() is exactly Unicode categories L and N, so the regex class [^\W_] is too.
_SPEAKABLE = re.compile(r"[^\W_]")
_UNSPEAKABLE_RUN = re.compile(r"[\W_][\W_]*")

# Punctuation set tight against CJK text; curly quotes are shared with English.
WIDE_PUNCTUATION = "，。！？；：、…「」『』《》〈〉【】〔〕"
OPENERS = "\"'“‘「『《〈【〔(["
CLOSERS = "\"'”’」』》〉】〕)]"

# How far a number or a mark looks for the letters that decide its language;
# the bound keeps long runs of digits or symbols linear.
NEAREST_REACH = 32

# One letter per character for script_weights: a CJK letter, other CJK (〇, ・, ゛),
# a letter of a space-separated script, anything else.
CJK_LETTER, CJK_OTHER, WORD_LETTER, OTHER = "C", "K", "a", "."
_CLASS_OF = {(True, True): CJK_LETTER, (True, False): CJK_OTHER, (False, True): WORD_LETTER, (False, False): OTHER}
_WORD_RUN = re.compile(WORD_LETTER + WORD_LETTER + "*")
_LETTER_CLASS = re.compile(f"[{CJK_LETTER}{WORD_LETTER}]")
# Distinct characters a table remembers; the bound keeps a stream of exotic texts from growing it forever.
_TABLE_SIZE = 1 << 16


class CharTable(dict[int, int | str | None]):
    """A str.translate table that works out each character's replacement once, on first sight.

    One translate call then maps a whole text in C, where a loop over its characters in Python
    costs a function call per character.
    """

    def __init__(self, replace: Callable[[str], str | None]) -> None:
        super().__init__()
        self.replace = replace

    def __missing__(self, code: int) -> int | str | None:
        if len(self) >= _TABLE_SIZE:
            self.clear()
        ch = chr(code)
        value = self.replace(ch)
        self[code] = code if value == ch else value
        return self[code]


def _class_of(ch: str) -> str:
    return _CLASS_OF[is_cjk(ch), ch.isalpha()]


_CLASSES = CharTable(_class_of)


def is_cjk(ch: str) -> bool:
    """Return whether the character is a Han ideograph or kana."""
    return ch >= "\u3005" and _CJK.fullmatch(ch) is not None  # every CJK range starts at U+3005 or later


def is_wide(ch: str) -> bool:
    """Return whether the character is CJK or full-width punctuation."""
    return ch in WIDE_PUNCTUATION or is_cjk(ch)


def is_speakable(ch: str) -> bool:
    """Return whether the character is a letter or a number a voice reads."""
    return ch.isalnum()


def is_word_letter(ch: str) -> bool:
    """Return whether the character is a letter of a space-separated script."""
    return ch.isalpha() and not is_cjk(ch)


def count_speakable(text: str) -> int:
    """Count the characters of text that a voice reads aloud."""
    return len(text) - sum(map(len, _UNSPEAKABLE_RUN.findall(text)))


def has_speakable(text: str, start: int = 0, end: int | None = None) -> bool:
    """Return whether text (or text[start:end]) holds anything a voice reads aloud."""
    return _SPEAKABLE.search(text, start, len(text) if end is None else end) is not None


def char_classes(text: str) -> str:
    """Return one class letter per character of text (CJK_LETTER, CJK_OTHER, WORD_LETTER or OTHER)."""
    return text.translate(_CLASSES)


def class_weights(classes: str, start: int, end: int) -> tuple[int, int]:
    """Count CJK characters and words of other scripts in classes[start:end]."""
    cjk = classes.count(CJK_LETTER, start, end) + classes.count(CJK_OTHER, start, end)
    return cjk, len(_WORD_RUN.findall(classes, start, end))


def has_letter(classes: str, start: int, end: int) -> bool:
    """Return whether classes[start:end] holds a letter of any script."""
    return _LETTER_CLASS.search(classes, start, end) is not None


def script_weights(text: str) -> tuple[int, int]:
    """Count CJK characters and words of other scripts in text."""
    return class_weights(char_classes(text), 0, len(text))


def nearest_letter(text: str, index: int, step: int, *, reach: int = NEAREST_REACH) -> tuple[int, str] | None:
    """Find the first letter within reach of index walking by step, with its distance."""
    for distance in range(1, reach + 1):
        if not 0 <= index < len(text):
            return None
        if text[index].isalpha():
            return distance, text[index]
        index += step
    return None


def context_language(text: str, start: int, end: int) -> str:
    """Return "zh" when the letters nearest to text[start:end] are CJK, else "en"."""
    found = [hit for hit in (nearest_letter(text, start - 1, -1), nearest_letter(text, end, 1)) if hit is not None]
    if not found:
        return "en"
    closest = min(distance for distance, _ in found)
    return "zh" if any(is_cjk(ch) for distance, ch in found if distance == closest) else "en"
