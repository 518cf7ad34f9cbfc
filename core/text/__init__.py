"""Normalise text, split it into sentences and plan synthesis segments."""

from core.text.chars import count_speakable
from core.text.normalize import normalize
from core.text.plan import plan_segments
from core.text.split import split_sentences
from core.text.stream import ready_cut

__all__ = ["count_speakable", "normalize", "plan_segments", "ready_cut", "split_sentences"]
