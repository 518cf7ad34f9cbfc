"""Plan the segments a text is synthesised in: whole sentences up to a length cap."""

import bisect
import re

from core.text.chars import has_speakable
from core.text.limits import TextBudget
from core.text.normalize import may_speak, normalize
from core.text.split import LEVELS, merged_starts


def _tidy(piece: str) -> str:
    return " ".join(piece.split())


class _Packer:
    """Pack pieces of text greedily into segments under per-segment caps."""

    def __init__(self, *, first_cap: int, cap: int, budget: TextBudget | None = None) -> None:
        self.first_cap = first_cap
        self.cap = cap
        self.budget = budget
        self.segments: list[str] = []
        self.planned_chars = 0

    def limit(self) -> int:
        """Return the cap of the segment being filled now: the first cap, then the length of all before it.

        No segment after the first is longer than the first cap or the segments before it together,
        whichever is more, so it can be made while they play; the caps grow from the first cap to the
        full cap as the buffered audio grows.
        """
        return min(self.cap, max(self.first_cap, self.planned_chars))

    def lead_clause_takes(self, piece: str, joined: str) -> bool:
        """Say whether a job's first segment, a short lead clause ("专家建议，"), takes the next unit (``joined``
        is both) past the first cap, up to half as much again.

        The second segment is made while the first plays, and a lead clause of a few characters plays for well
        under a second: less than one engine call under load takes to make the full clause after it. (Every
        listener who underran in bench-goodput's overload runs had a first segment of 5 or 6 characters and a
        second of about 20.) So a first segment shorter than half the first cap takes the next unit with it when
        that unit is more than twice as long.
        """
        if self.planned_chars or not has_speakable(piece):  # not the job's first segment, or nothing to say yet
            return False
        lead, both = len(_tidy(piece)), len(_tidy(joined))
        return lead < self.first_cap / 2 and both - lead > 2 * lead and both <= min(self.cap, self.first_cap * 3 // 2)

    def flush(self, piece: str) -> None:
        """Close a segment if the piece has anything to say."""
        if has_speakable(piece):
            segment = _tidy(piece)
            self.segments.append(segment)
            self.planned_chars += len(segment)
            if self.budget is not None:
                self.budget.add_segment()

    def pack(self, text: str, level: int = 0) -> str:
        """Pack text cut at the given level; return the open, unflushed tail.

        The open segment is text[start:end]. Units that end within the cap of its start fit for
        certain (tidying only shortens), so they are taken in one step: the work is linear in the
        units, not in units times segments.
        """
        cuts, every_piece_speaks = LEVELS[level]
        starts = merged_starts(text, cuts(text), every_piece_speaks=every_piece_speaks)
        ends = [*starts[1:], len(text)]
        start = end = 0
        k = 0
        while k < len(starts):
            if start == end:
                start = end = starts[k]
            limit = self.limit()
            sure = bisect.bisect_right(ends, start + limit, lo=k) - 1
            if sure >= k:
                end, k = ends[sure], sure + 1
                continue
            unit_end = ends[k]
            if len(_tidy(text[start:unit_end])) <= limit:
                end, k = unit_end, k + 1
                continue
            if self.lead_clause_takes(text[start:end], text[start:unit_end]):
                end, k = unit_end, k + 1
                continue
            self.flush(text[start:end])
            unit = text[starts[k] : unit_end]
            if len(_tidy(unit)) <= self.limit():
                start, end = starts[k], unit_end
            elif level + 1 < len(LEVELS):
                tail = self.pack(unit, level + 1)
                start, end = unit_end - len(tail), unit_end
            else:
                self.hard_cut(unit)
                start = end = unit_end
            k += 1
        return text[start:end]

    def hard_cut(self, unit: str) -> None:
        """Cut a single character and its punctuation that exceed the cap."""
        # Only reachable with caps smaller than a run of punctuation; the
        # pieces without a letter are punctuation and are dropped.
        rest = _tidy(unit)
        at = 0
        while at < len(rest):
            limit = self.limit()
            self.flush(rest[at : at + limit])
            at += limit


_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n\s*")


def paragraphs(text: str) -> list[str]:
    """Split text at blank lines."""
    return _PARAGRAPH_BREAK.split(text)


def plan_segments(
    text: str,
    *,
    max_chars: int = 120,
    first_max_chars: int = 40,
    language: str = "auto",
    max_total_chars: int | None = None,
    max_segments: int | None = None,
    planned_chars: int = 0,
    planned_segments: int = 0,
) -> list[str]:
    """Normalise text and cut it into segments, the first one short for a quick start.

    Segments never span a blank line: each paragraph is packed on its own, so
    editing one paragraph leaves every other paragraph's segments (and their
    cached audio) unchanged. With max_total_chars (normalised characters) or
    max_segments, raise TextOverLimit as soon as the text is certain to be over
    either, so that an input which expands costs no more than the limit.
    ``planned_chars`` and ``planned_segments`` continue a plan: what was already planned before this text (a text
    stream's earlier pieces), so the first cap applies only to a job's first segment, the caps keep growing, and
    the limits count the whole job (an error states the limit itself, not what was left of it).
    """
    if max_chars < 1 or first_max_chars < 1:
        raise ValueError(f"caps must be positive, got {max_chars} and {first_max_chars}")
    budget = TextBudget(max_chars=max_total_chars, max_segments=max_segments, chars=planned_chars,
                        segments=planned_segments)  # fmt: skip
    packer = _Packer(first_cap=min(first_max_chars, max_chars), cap=max_chars, budget=budget)
    packer.planned_chars = planned_chars
    for paragraph in paragraphs(text):
        if not may_speak(paragraph):
            continue  # thousands of paragraphs of marks or emoji cost a scan each, not a normalisation
        normalized = normalize(paragraph, language=language, budget=budget)
        if has_speakable(normalized):
            budget.add_chars(len(normalized))
            packer.flush(packer.pack(normalized))
    return packer.segments
