"""Classify characters by script and by whether a voice can speak them."""

import re
import unicodedata

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

# Punctuation set tight against CJK text; curly quotes are shared with English.
WIDE_PUNCTUATION = "，。！？；：、…「」『』《》〈〉【】〔〕"
OPENERS = "\"'“‘「『《〈【〔(["
CLOSERS = "\"'”’」』》〉】〕)]"

# How far a number or a mark looks for the letters that decide its language;
# the bound keeps long runs of digits or symbols linear.
NEAREST_REACH = 32


def is_cjk(ch: str) -> bool:
    """Return whether the character is a Han ideograph or kana."""
    return _CJK.fullmatch(ch) is not None


def is_wide(ch: str) -> bool:
    """Return whether the character is CJK or full-width punctuation."""
    return ch in WIDE_PUNCTUATION or is_cjk(ch)


def is_speakable(ch: str) -> bool:
    """Return whether the character is a letter or a number a voice reads."""
    return unicodedata.category(ch)[0] in "LN"


def is_word_letter(ch: str) -> bool:
    """Return whether the character is a letter of a space-separated script."""
    return ch.isalpha() and not is_cjk(ch)


def count_speakable(text: str) -> int:
    """Count the characters of text that a voice reads aloud."""
    return sum(1 for ch in text if is_speakable(ch))


def has_speakable(text: str) -> bool:
    """Return whether text holds anything a voice reads aloud."""
    return any(is_speakable(ch) for ch in text)


def script_weights(text: str) -> tuple[int, int]:
    """Count CJK characters and words of other scripts in text."""
    cjk = words = 0
    in_word = False
    for ch in text:
        if is_cjk(ch):
            cjk += 1
            in_word = False
        elif ch.isalpha():
            words += 0 if in_word else 1
            in_word = True
        else:
            in_word = False
    return cjk, words


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
