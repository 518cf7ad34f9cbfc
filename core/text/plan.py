"""Plan the segments a text is synthesised in: whole sentences up to a length cap."""

import re
from collections.abc import Callable

from core.text.chars import count_speakable, has_speakable
from core.text.normalize import normalize
from core.text.split import char_spans, clause_spans, merge_unspeakable, sentence_spans, word_spans

# From coarse to fine: a piece too long for its segment is cut at the next level.
_LEVELS: tuple[Callable[[str], list[str]], ...] = (sentence_spans, clause_spans, word_spans, char_spans)


def _tidy(piece: str) -> str:
    return " ".join(piece.split())


class _Packer:
    """Pack pieces of text greedily into segments under per-segment caps."""

    def __init__(self, *, first_cap: int, cap: int) -> None:
        self.first_cap = first_cap
        self.cap = cap
        self.segments: list[str] = []

    def limit(self) -> int:
        """Return the cap of the segment being filled now: the first cap, then the length of all before it.

        No segment is longer than the segments before it together, so it can be made while they
        play; the caps grow from the first cap to the full cap as the buffered audio grows.
        """
        return min(self.cap, max(self.first_cap, sum(map(len, self.segments))))

    def flush(self, piece: str) -> None:
        """Close a segment if the piece has anything to say."""
        if has_speakable(piece):
            self.segments.append(_tidy(piece))

    def pack(self, text: str, level: int = 0) -> str:
        """Pack text cut at the given level; return the open, unflushed tail."""
        current = ""
        for unit in merge_unspeakable(_LEVELS[level](text)):
            if len(_tidy(current + unit)) <= self.limit():
                current += unit
                continue
            self.flush(current)
            current = ""
            if len(_tidy(unit)) <= self.limit():
                current = unit
            elif level + 1 < len(_LEVELS):
                current = self.pack(unit, level + 1)
            else:
                self.hard_cut(unit)
        return current

    def hard_cut(self, unit: str) -> None:
        """Cut a single character and its punctuation that exceed the cap."""
        # Only reachable with caps smaller than a run of punctuation; the
        # pieces without a letter are punctuation and are dropped.
        rest = _tidy(unit)
        while rest:
            limit = self.limit()
            self.flush(rest[:limit])
            rest = rest[limit:]


_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n\s*")


def paragraphs(text: str) -> list[str]:
    """Split text at blank lines."""
    return _PARAGRAPH_BREAK.split(text)


def plan_segments(text: str, *, max_chars: int = 120, first_max_chars: int = 40, language: str = "auto") -> list[str]:
    """Normalise text and cut it into segments, the first one short for a quick start.

    Segments never span a blank line: each paragraph is packed on its own, so
    editing one paragraph leaves every other paragraph's segments (and their
    cached audio) unchanged.
    """
    if max_chars < 1 or first_max_chars < 1:
        raise ValueError(f"caps must be positive, got {max_chars} and {first_max_chars}")
    packer = _Packer(first_cap=min(first_max_chars, max_chars), cap=max_chars)
    for paragraph in paragraphs(text):
        normalized = normalize(paragraph, language=language)
        if count_speakable(normalized):
            packer.flush(packer.pack(normalized))
    return packer.segments
