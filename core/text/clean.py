"""Remove characters a voice cannot speak and unify the ones it can."""

import re
import unicodedata

from core.text.chars import CLOSERS, OPENERS, WIDE_PUNCTUATION

# Punctuation that survives cleaning; everything else that is not a letter,
# a combining mark or whitespace is a symbol a TTS model cannot say.
KEPT_PUNCTUATION = frozenset(",.!?;:'-" + WIDE_PUNCTUATION + OPENERS + CLOSERS)

# Only ASCII commas: after NFKC a Chinese list "100，200" would look the same.
_DIGIT_GROUPS = re.compile(r"(?<!\d)(?<!\d[,.])\d{1,3}(?:,\d{3})+(?!\d|,\d)")
_LINE_BREAKS = re.compile(r"\r\n?|[\u2028\u2029\x0b\x0c\x85]")
_DASHES = re.compile(r"[^\S\n]*(?:[\u2012-\u2015\u2e3a\u2e3b]+|(?<=\s)-+(?=\s)|-{2,})[^\S\n]*")
_HYPHENS = re.compile(r"[\u2010\u2011]")
_LOOSE_HYPHEN = re.compile(r"(?<![^\W\d_])-|-(?![^\W\d_])")
_VARIATION_SELECTORS = re.compile("[\ufe00-\ufe0f\U000e0100-\U000e01ef]")


def _is_invisible(ch: str) -> bool:
    # Format characters (zero-width space and joiners, BOM, bidi marks),
    # controls other than whitespace, surrogates, private use and unassigned.
    category = unicodedata.category(ch)
    return category in ("Cf", "Cs", "Co", "Cn") or (category == "Cc" and not ch.isspace())


def remove_invisible(text: str) -> str:
    """Drop control and zero-width characters and unify line breaks to newlines."""
    text = _LINE_BREAKS.sub("\n", text)
    text = _VARIATION_SELECTORS.sub("", text)
    return "".join(ch for ch in text if not _is_invisible(ch))


def join_digit_groups(text: str) -> str:
    """Remove thousands separators such as in "1,234,567" before NFKC can blur them."""
    return _DIGIT_GROUPS.sub(lambda match: match.group(0).replace(",", ""), text)


def unify_digits(text: str) -> str:
    """Rewrite every decimal digit as ASCII and unify minus and fraction signs."""
    out = []
    for ch in text:
        if ch.isdecimal() and not ch.isascii():
            out.append(str(unicodedata.decimal(ch)))
        elif ch == "\u2212":
            out.append("-")
        elif ch == "\u2044":
            out.append("/")
        else:
            out.append(ch)
    return "".join(out)


def _keeps(ch: str) -> bool:
    category = unicodedata.category(ch)
    if category[0] == "L" or category in ("Mn", "Mc", "Nl"):
        return True
    return ch.isspace() or ch in KEPT_PUNCTUATION


def drop_unspeakable(text: str) -> str:
    """Replace symbols, emoji and leftover digits with spaces, and dashes with commas."""
    text = _HYPHENS.sub("-", text)
    text = _DASHES.sub(", ", text)
    text = "".join(ch if _keeps(ch) else " " for ch in text)
    return _LOOSE_HYPHEN.sub(" ", text)
