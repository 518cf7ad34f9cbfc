"""Find sentence, clause, word and character boundaries in Chinese, English and mixed text.

Every scan moves forward only (the next candidate mark is found with one regex search from
where the last one ended), so each boundary finder is linear in its text.
"""

import itertools
import re
import string
from collections.abc import Callable, Iterable

from core.text.chars import CJK_CLASS, CLOSERS, has_speakable, is_cjk, is_wide

SENTENCE_ENDS = frozenset("。！？!?；;")
CLAUSE_ENDS = frozenset("，,、：:…")
# Title-like abbreviations that are followed by a capitalised name; any other
# "word. lowercase" is already kept together by the lowercase rule below.
ABBREVIATIONS = frozenset(
    ("mr", "mrs", "ms", "mx", "dr", "prof", "sr", "jr", "st", "mt", "vs",
     "gen", "col", "capt", "lt", "sgt", "rev", "hon", "gov", "rep", "sen", "messrs")
)  # fmt: skip
_INITIALS = re.compile(r"[A-Z]|[A-Za-z](?:\.[A-Za-z])+")
_TOKEN_CHARS = frozenset(string.ascii_letters + ".")


def _not_after_abbreviation() -> str:
    # After a consumed dot: it does not end a title or an initial that follows a space or a mark.
    # Those dots are what is_abbreviation would keep; a regex skips them without a Python call.
    # Letters are spelled [Mm][Rr]: re's (?i) would also take "ſ" (U+017F) for "s".
    by_length: dict[int, list[str]] = {1: ["[A-Z]"]}
    for word in sorted(ABBREVIATIONS):
        by_length.setdefault(len(word), []).append("".join(f"[{c.upper()}{c}]" for c in word))
    return "".join(
        f"(?:(?<!(?:{'|'.join(words)})\\.)|(?<=[.A-Za-z](?:{'|'.join(words)})\\.))" for words in by_length.values()
    )


NOT_AFTER_ABBREVIATION = _not_after_abbreviation()
_TAIL = SENTENCE_ENDS | CLAUSE_ENDS | frozenset(CLOSERS) | {"."}
_TAIL_AND_SPACE = re.compile("[" + re.escape("".join(sorted(_TAIL))) + r"]*\s*")
_CLOSER_RUN = re.compile("[" + re.escape(CLOSERS) + "]*")
# A dot right before an ASCII letter or digit is never a full stop (3.14, e.g, example.com).
_SENTENCE_MARK = re.compile(
    "[" + re.escape("".join(sorted(SENTENCE_ENDS))) + r".\n](?:(?<!\.)|(?![A-Za-z0-9]))" + NOT_AFTER_ABBREVIATION
)
_CLAUSE_MARK = re.compile("[" + re.escape("".join(sorted(CLAUSE_ENDS))) + r".](?:(?<!\.)|(?=\.))")
# A pattern that starts with a character class lets re skip ahead to candidates at C speed.
_SPEAKABLE_RUN = re.compile(r"[^\W_][^\W_]*")
# From the start of a gap between two words to just after its last space.
_TO_LAST_SPACE = re.compile(r"[\W_]*\s")
_CJK = re.compile(f"[{CJK_CLASS}]")
_ALL_CJK = re.compile(f"[{CJK_CLASS}]+")


def is_abbreviation(text: str, dot: int) -> bool:
    """Return whether the full stop at text[dot] ends an abbreviation or an initial."""
    start = dot
    while start > 0 and text[start - 1] in _TOKEN_CHARS:
        start -= 1
    token = text[start:dot].lstrip(".")
    return token.lower() in ABBREVIATIONS or _INITIALS.fullmatch(token) is not None


def _is_full_stop(text: str, i: int) -> bool:
    if text[i - 1 : i] == "." or text[i + 1 : i + 2] == ".":
        return False  # part of an ellipsis
    j = _CLOSER_RUN.match(text, i + 1).end()  # type: ignore[union-attr]  # a * pattern always matches
    if j < len(text) and not (text[j].isspace() or is_wide(text[j])):
        return False  # 3.14, e.g, example.com
    return not is_abbreviation(text, i)


def _skip_tail(text: str, j: int) -> int:
    return _TAIL_AND_SPACE.match(text, j).end()  # type: ignore[union-attr]  # a * pattern always matches


def sentence_cuts(text: str) -> list[int]:
    """Return the offsets just after each sentence end (and its closing marks and spaces)."""
    cuts = []
    i = 0
    while (mark := _SENTENCE_MARK.search(text, i)) is not None:
        i = mark.start()
        ch = text[i]
        if ch == "\n":
            i = _skip_tail(text, i)
            cuts.append(i)
        elif ch != "." or _is_full_stop(text, i):
            j = _skip_tail(text, i + 1)
            # "Stop!" she said. / "e.g. this": a lowercase word continues the sentence.
            if not (ch in ".!?" and j < len(text) and text[j].islower()):
                cuts.append(j)
            i = j
        else:
            i += 1
    return cuts


def clause_cuts(text: str) -> list[int]:
    """Return the offsets just after each comma, enumeration comma, colon or ellipsis."""
    cuts = []
    i = 0
    while (mark := _CLAUSE_MARK.search(text, i)) is not None:
        i = mark.start()
        between_digits = text[i - 1 : i].isdigit() and text[i + 1 : i + 2].isdigit()
        if (text[i] in CLAUSE_ENDS and not between_digits) or text.startswith("..", i):
            i = _skip_tail(text, i + 1)
            cuts.append(i)
        else:
            i += 1
    return cuts


def word_cuts(text: str) -> list[int]:
    """Return the offsets between words (after the spaces, before opening quotes) and between CJK characters."""
    cuts: list[int] = []
    previous_end = -1
    for run in _SPEAKABLE_RUN.finditer(text):
        start, end = run.span()
        if previous_end >= 0:  # the gap between two speakable characters
            if start - previous_end == 1 and text[previous_end].isspace():
                cuts.append(start)  # the usual one space, without a regex call
            elif (spaced := _TO_LAST_SPACE.match(text, previous_end, start)) is not None:
                cuts.append(spaced.end())  # opening quotes stay with their word
            elif is_cjk(text[start]) or is_cjk(text[previous_end - 1]):
                cuts.append(start)
        if _CJK.search(text, start, end) is None:
            pass
        elif _ALL_CJK.fullmatch(text, start, end):
            cuts.extend(range(start + 1, end))
        else:
            cuts.extend(i for i in range(start + 1, end) if is_cjk(text[i - 1]) or is_cjk(text[i]))
        previous_end = end
    return cuts


def char_cuts(text: str) -> list[int]:
    """Return the offsets of every speakable character but the first."""
    cuts = [i for run in _SPEAKABLE_RUN.finditer(text) for i in range(*run.span())]
    return cuts[1:]


def _bounds(text: str, cuts: Iterable[int]) -> list[int]:
    return [0, *sorted({c for c in cuts if 0 < c < len(text)}), len(text)]


def _cut(text: str, cuts: Iterable[int]) -> list[str]:
    return [text[a:b] for a, b in itertools.pairwise(_bounds(text, cuts)) if a < b]


def merged_starts(text: str, cuts: list[int], *, every_piece_speaks: bool = False) -> list[int]:
    """Return where each piece starts once pieces with nothing to say join a neighbour (as merge_unspeakable).

    cuts must be increasing. every_piece_speaks says that each piece between them holds a speakable
    character whenever text does (true of word and character cuts), which saves checking each piece.
    """
    inner = [c for c in cuts if 0 < c < len(text)] if cuts and (cuts[0] <= 0 or cuts[-1] >= len(text)) else cuts
    if every_piece_speaks:
        return [0, *inner] if has_speakable(text) else []
    bounds = [0, *inner, len(text)]
    starts = [a for a, b in itertools.pairwise(bounds) if has_speakable(text, a, b)]
    if starts:
        starts[0] = 0  # what comes before the first speakable piece leads into it
    return starts


def sentence_spans(text: str) -> list[str]:
    """Cut text after each sentence end; the pieces concatenate back to text."""
    return _cut(text, sentence_cuts(text))


def clause_spans(text: str) -> list[str]:
    """Cut text after each comma, enumeration comma, colon or ellipsis."""
    return _cut(text, clause_cuts(text))


def word_spans(text: str) -> list[str]:
    """Cut text between words and between CJK characters."""
    return _cut(text, word_cuts(text))


def char_spans(text: str) -> list[str]:
    """Cut text before every speakable character."""
    return _cut(text, char_cuts(text))


# From coarse to fine: a piece too long for its segment is cut at the next level. The flag
# says whether every piece between two cuts of that level holds something to say.
LEVELS: tuple[tuple[Callable[[str], list[int]], bool], ...] = (
    (sentence_cuts, False),
    (clause_cuts, False),
    (word_cuts, True),
    (char_cuts, True),
)


def merge_unspeakable(spans: Iterable[str]) -> list[str]:
    """Attach pieces with nothing to say to their neighbour, keeping order."""
    # Lists joined once: adding many pieces to one string, piece by piece, would copy it each time.
    merged: list[list[str]] = []
    carry: list[str] = []
    for span in spans:
        if has_speakable(span):
            merged.append([*carry, span])
            carry = []
        elif merged:
            merged[-1].append(span)
        else:
            carry.append(span)
    return ["".join(pieces) for pieces in merged]


def split_sentences(text: str) -> list[str]:
    """Split Chinese, English or mixed text into stripped, speakable sentences."""
    return [span.strip() for span in merge_unspeakable(sentence_spans(text))]
