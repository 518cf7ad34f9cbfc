"""Where text that is still arriving may be cut: only where no later piece can change how it is read.

A text stream's buffer is planned up to its last safe cut and the rest waits for more. A sentence end is
safe once something follows it (a space, a new line, the next sentence), or when it is a wide mark that no
number or abbreviation uses; never the last character of the buffer otherwise, because "3." may become "3.14"
and "Dr." a name. Past ``max_chars`` with no sentence end, a clause end or a space that touches no digit will do,
so a long unpunctuated run still starts to play; a number or a date ("2024年5" + "月1日") is never cut.
"""

from __future__ import annotations

from core.text.split import clause_cuts, sentence_cuts, word_cuts

#: Marks after which a cut at the very end of the buffer is safe: no later text can make them part of a word.
WIDE_ENDS = frozenset("。！？；…」』）】”’")


def _safe(text: str, cut: int) -> bool:
    """Say whether the buffer may be cut at ``cut`` (0 < cut ≤ len) without changing how either side reads."""
    if cut < len(text):
        return True
    last = text[cut - 1]
    return last.isspace() or last in WIDE_ENDS


def _touches_digit(text: str, cut: int) -> bool:
    """Say whether a cut has a digit right beside it (a number, or a date such as 2024年5月, would be split)."""
    return text[cut - 1 : cut].isdigit() or text[cut : cut + 1].isdigit()


def ready_cut(text: str, *, final: bool, max_chars: int) -> int:
    """Return how much of a stream's buffered text can be planned now (0: wait for more; ``len(text)``: all)."""
    if final:
        return len(text)
    safe_ends = [c for c in sentence_cuts(text) if _safe(text, c)]
    if safe_ends:
        return safe_ends[-1]
    if len(text) <= max_chars:
        return 0
    for cuts in (clause_cuts(text), word_cuts(text)):
        usable = [c for c in cuts if c < len(text) and not _touches_digit(text, c)]
        if usable:
            return usable[-1]
    return 0
