"""Remove characters a voice cannot speak and unify the ones it can."""

import re
import unicodedata

from core.text.chars import CLOSERS, OPENERS, WIDE_PUNCTUATION, CharTable

# Punctuation that survives cleaning; everything else that is not a letter,
# a combining mark or whitespace is a symbol a TTS model cannot say.
KEPT_PUNCTUATION = frozenset(",.!?;:'-" + WIDE_PUNCTUATION + OPENERS + CLOSERS)

# Only ASCII commas: after NFKC a Chinese list "100，200" would look the same.
_DIGIT_GROUPS = re.compile(r"(?<!\d)(?<!\d[,.])\d{1,3}(?:,\d{3})+(?!\d|,\d)")
_LINE_BREAKS = re.compile(r"\r\n?|[\u2028\u2029\x0b\x0c\x85]")
_LINE_BREAK_CHAR = re.compile(r"[\r\u2028\u2029\x0b\x0c\x85]")
_DIGIT_GROUP_HINT = re.compile(r"\d,\d")
# Leading spaces are taken only from the start of their run, and never given back: a run that
# no dash follows is then tried once, not once per space (which was quadratic in the run).
_DASHES = re.compile(r"(?:(?<![^\S\n])[^\S\n]++)?(?:[\u2012-\u2015\u2e3a\u2e3b]+|(?<=\s)-+(?=\s)|-{2,})[^\S\n]*+")
_WIDE_DASH = re.compile(r"[\u2012-\u2015\u2e3a\u2e3b]")
_SPACED_HYPHEN = re.compile(r"\s-")
_HYPHENS = re.compile(r"[\u2010\u2011]")
_LOOSE_HYPHEN = re.compile(r"-(?:(?<![^\W\d_]-)|(?![^\W\d_]))")
_VARIATION_SELECTORS = re.compile("[\ufe00-\ufe0f\U000e0100-\U000e01ef]")
# Blocks where no character is invisible, and where every character is kept: a text made only of
# them skips the character-by-character step (tests/test_text_adversarial.py checks both lists).
VISIBLE_RANGES: tuple[tuple[int, int], ...] = (
    (0x09, 0x0D), (0x1C, 0x7E), (0x85, 0x85), (0xA0, 0xAC), (0xAE, 0x377), (0x38E, 0x3A1), (0x3A3, 0x52F),
    (0x2000, 0x200A), (0x2010, 0x2029), (0x202F, 0x205F), (0x2190, 0x2426), (0x2460, 0x2B73),
    (0x3000, 0x303F), (0x3041, 0x3096), (0x3099, 0x30FF), (0x3400, 0x9FFF), (0xFE30, 0xFE52), (0xFF01, 0xFFBE),
    (0x1F300, 0x1F6D7), (0x1F900, 0x1FA53),
)  # fmt: skip
KEPT_RANGES: tuple[tuple[int, int], ...] = (
    (0x09, 0x0D), (0x1C, 0x20), (0x41, 0x5A), (0x61, 0x7A), (0x85, 0x85), (0xA0, 0xA0), (0xC0, 0xD6),
    (0xD8, 0xF6), (0xF8, 0x24F), (0x3000, 0x3000), (0x3041, 0x3096), (0x30A1, 0x30FA), (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
)  # fmt: skip


def _class(ranges: tuple[tuple[int, int], ...], extra: str = "") -> str:
    return "".join(f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in ranges) + re.escape(extra)


_MAYBE_INVISIBLE = re.compile(f"[^{_class(VISIBLE_RANGES)}]")
_MAYBE_DROPPED = re.compile(f"[^{_class(KEPT_RANGES, ''.join(sorted(KEPT_PUNCTUATION)))}]")
_NON_ASCII_DIGIT = re.compile(r"[^\D0-9]")


def _is_invisible(ch: str) -> bool:
    # Format characters (zero-width space and joiners, BOM, bidi marks),
    # controls other than whitespace, surrogates, private use and unassigned.
    category = unicodedata.category(ch)
    return category in ("Cf", "Cs", "Co", "Cn") or (category == "Cc" and not ch.isspace())


def _visible_or_none(ch: str) -> str | None:
    return None if _is_invisible(ch) else ch


def _ascii_digit(ch: str) -> str:
    if ch.isdecimal() and not ch.isascii():
        return str(unicodedata.decimal(ch))
    return {"\u2212": "-", "\u2044": "/"}.get(ch, ch)


def _keeps(ch: str) -> bool:
    category = unicodedata.category(ch)
    if category[0] == "L" or category in ("Mn", "Mc", "Nl"):
        return True
    return ch.isspace() or ch in KEPT_PUNCTUATION


def _kept_or_space(ch: str) -> str:
    return ch if _keeps(ch) else " "


_VISIBLE = CharTable(_visible_or_none)
_ASCII_DIGITS = CharTable(_ascii_digit)
_SPEAKABLE_OR_SPACE = CharTable(_kept_or_space)


def remove_invisible(text: str) -> str:
    """Drop control and zero-width characters and unify line breaks to newlines."""
    if _LINE_BREAK_CHAR.search(text):
        text = _LINE_BREAKS.sub("\n", text)
    text = _VARIATION_SELECTORS.sub("", text)
    return text if _MAYBE_INVISIBLE.search(text) is None else text.translate(_VISIBLE)


def join_digit_groups(text: str) -> str:
    """Remove thousands separators such as in "1,234,567" before NFKC can blur them."""
    if _DIGIT_GROUP_HINT.search(text) is None:
        return text
    return _DIGIT_GROUPS.sub(lambda match: match.group(0).replace(",", ""), text)


def unify_digits(text: str) -> str:
    """Rewrite every decimal digit as ASCII and unify minus and fraction signs."""
    if _NON_ASCII_DIGIT.search(text) is None and "\u2212" not in text and "\u2044" not in text:
        return text
    return text.translate(_ASCII_DIGITS)


def drop_unspeakable(text: str) -> str:
    """Replace symbols, emoji and leftover digits with spaces, and dashes with commas."""
    text = _HYPHENS.sub("-", text)
    if _WIDE_DASH.search(text) or "--" in text or _SPACED_HYPHEN.search(text):
        text = _DASHES.sub(", ", text)
    if _MAYBE_DROPPED.search(text) is not None:
        text = text.translate(_SPEAKABLE_OR_SPACE)
    return _LOOSE_HYPHEN.sub(" ", text) if "-" in text else text
