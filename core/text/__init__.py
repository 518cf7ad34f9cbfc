"""Normalise text, split it into sentences and plan synthesis segments."""

from core.text.chars import count_speakable
from core.text.normalize import normalize
from core.text.plan import plan_segments
from core.text.split import split_sentences

__all__ = ["count_speakable", "normalize", "plan_segments", "split_sentences"]
