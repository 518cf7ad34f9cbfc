"""Give punctuation the width of the script around it and tidy the spacing."""

import re

from core.text.chars import (
    CJK_CLASS,
    CLOSERS,
    OPENERS,
    WIDE_PUNCTUATION,
    char_classes,
    class_weights,
    has_letter,
    is_cjk,
    is_word_letter,
    nearest_letter,
)
from core.text.split import NOT_AFTER_ABBREVIATION, is_abbreviation

TO_WIDE = {",": "，", ".": "。", "!": "！", "?": "？", ";": "；", ":": "："}
TO_ASCII = {wide: narrow for narrow, wide in TO_WIDE.items()} | {"、": ","}
ELLIPSIS = "…"
_MARKS = "".join(TO_WIDE) + "".join(TO_ASCII) + ELLIPSIS
_ALL_PUNCTUATION = re.escape(_MARKS + OPENERS + CLOSERS + WIDE_PUNCTUATION)
_TIGHT = re.escape("，。！？；：、…「」『』《》〈〉【】〔〕")

# Patterns start with a character class where they can, so that re skips ahead to candidates at
# C speed instead of trying every position. Spaces are taken from the start of their run only, and
# never given back: a run that no closer follows is then tried once, not once per space (quadratic).
_SPACE_BEFORE_CLOSER = re.compile(r"[^\S\n](?<![^\S\n][^\S\n])[^\S\n]*+(?=[,.!?;:…)\]”’]|[" + _TIGHT + "])")
_SPACE_AFTER_OPENER = re.compile(r"[^\S\n](?<=[(\[“‘][^\S\n])[^\S\n]*")
_LEADING_MARKS = re.compile(r"^[" + re.escape(_MARKS) + r"\s]+", re.MULTILINE)
# A match starts only where a run of dots and 。 starts: "。.。.…" tried from every mark was quadratic.
_ELLIPSES = re.compile(r"(?<![.。])[.。]*(?:\.{2,}|。{2,}|…)[.。…]*")
_RUN = re.compile("[" + _ALL_PUNCTUATION + "][" + _ALL_PUNCTUATION + "]+")
# Dots that always stay are not even looked at: between two ASCII letters ("Node.js"), or after a
# title or an initial ("Mr.", "J.").
_MARK = re.compile("[" + re.escape(_MARKS) + r"](?:(?<![A-Za-z].)|(?<!\.)|(?![A-Za-z]))" + NOT_AFTER_ABBREVIATION)
# Once the marks left are all wide (or all narrow), only these change.
_TO_WIDEN = re.compile("[" + re.escape("".join(TO_WIDE) + ELLIPSIS) + "]")
_WIDE_MARKS = re.escape("".join(TO_ASCII) + ELLIPSIS)
_TO_NARROW = re.compile(f"[{_WIDE_MARKS},!?;:](?:(?<=[{_WIDE_MARKS}])|(?=[^\\W_]))")
# Every letter of a space-separated script matches (and a few numerals that are not letters).
_MAYBE_WORD_LETTER = re.compile(rf"[^\W\d_{CJK_CLASS}]")
_ANY_CJK = re.compile(f"[{CJK_CLASS}]")
_SPACES = re.compile(r"[^\S\n]+")
# A space _SPACES would change: not a plain space, or one of a run.
_ODD_SPACE = re.compile(r"[^\S\n](?:(?<! )|(?=[^\S\n]))")
_LINE_BREAK = re.compile(r" ?\n\s*")
_WIDE_GAP = re.compile(
    " (?:(?<=[" + CJK_CLASS + _TIGHT + "] )(?=[" + CJK_CLASS + _TIGHT + "])"
    "|(?<=[" + _TIGHT + "] )|(?=[" + _TIGHT + "]))"
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


def _wants_wide(classes: str, text: str, i: int, language: str) -> bool:
    cjk, words = class_weights(classes, 0, len(classes))
    if cjk or words:
        return cjk >= words
    hit = nearest_letter(text, i - 1, -1) or nearest_letter(text, i + 1, 1)
    return is_cjk(hit[1]) if hit else language == "zh"


def _keeps_ascii(text: str, i: int) -> bool:
    # Dots inside "Node.js" or "e.g" and after "Mr" belong to the word.
    if text[i] != ".":
        return False
    inside_word = 0 < i < len(text) - 1 and is_word_letter(text[i + 1]) and is_word_letter(text[i - 1])
    return inside_word or is_abbreviation(text, i)


def _widened(match: re.Match[str]) -> str:
    ch = match.group(0)
    if ch == ELLIPSIS:
        return "……"
    return ch if _keeps_ascii(match.string, match.start()) else TO_WIDE[ch]


def _narrowed(match: re.Match[str]) -> str:
    ch = match.group(0)
    if ch == ELLIPSIS:
        return "..."
    spacer = " " if match.string[match.end() : match.end() + 1].isalnum() else ""
    return TO_ASCII.get(ch, ch) + spacer


def _rest_settled(text: str, start: int, wide: bool, out: list[str]) -> bool:
    """Append text[start:] with its marks made wide or narrow if every later clause must agree with wide."""
    # With no letter of the other kind left, each later clause decides as this one did.
    if wide and _MAYBE_WORD_LETTER.search(text, start) is None:
        changes, replace = _TO_WIDEN.finditer(text, start), _widened
    elif not wide and _ANY_CJK.search(text, start) is None:
        changes, replace = _TO_NARROW.finditer(text, start), _narrowed
    else:
        return False
    copied = start
    for match in changes:
        out.append(text[copied : match.start()])
        out.append(replace(match))
        copied = match.end()
    out.append(text[copied:])
    return True


def _localize(text: str, language: str) -> str:
    out: list[str] = []
    copied = 0
    clause_start = 0
    wide: bool | None = None
    for match in _MARK.finditer(text):
        i = match.start()
        if _keeps_ascii(text, i):
            continue
        classes = char_classes(text[clause_start:i])
        # A mark right after another ("?!", "。」") takes the same width.
        was = wide
        if wide is None or has_letter(classes, 0, len(classes)):
            wide = _wants_wide(classes, text, i, language)
        ch = match.group(0)
        out.append(text[copied:i])
        if ch == ELLIPSIS:
            out.append("……" if wide else "...")
        elif wide:
            out.append(TO_WIDE.get(ch, ch))
        else:
            # "Hello，world" needs the space that full-width marks carry within them.
            spacer = " " if ch != "." and text[i + 1 : i + 2].isalnum() else ""
            out.append(TO_ASCII.get(ch, ch) + spacer)
        copied = clause_start = i + 1
        if wide != was and _rest_settled(text, copied, wide, out):
            return "".join(out)
    if not out:
        return text
    out.append(text[copied:])
    return "".join(out)


def tidy_whitespace(text: str) -> str:
    """Collapse spaces, keep single line breaks and drop spaces CJK text does not use."""
    if _ODD_SPACE.search(text):
        text = _SPACES.sub(" ", text)
    text = text.strip()
    if "\n" in text:
        text = _LINE_BREAK.sub("\n", text)
    if " " not in text:
        return text
    text = _WIDE_GAP.sub("", text)
    text = _SPACE_BEFORE_CLOSER.sub("", text)
    return _SPACE_AFTER_OPENER.sub("", text)


def _tidy_once(text: str, language: str) -> str:
    text = tidy_whitespace(text)
    if "\n" in text or text[:1] in _MARKS or text[:1].isspace():
        text = _LEADING_MARKS.sub("", text)  # "^" matches only there
    if "’" in text:
        text = _WORD_APOSTROPHE.sub("'", text)
    if ELLIPSIS in text or ".." in text or "。。" in text:
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
