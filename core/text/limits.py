"""Count what a text becomes once normalised, and stop the moment it is over a job's limits."""

from dataclasses import dataclass

from core.errors import TextOverLimit

#: The settings that name each limit in an error (TTS_MAX_TEXT_CHARS, TTS_MAX_SEGMENTS).
CHARS_SETTING = "max_text_chars"
SEGMENTS_SETTING = "max_segments"


@dataclass
class TextBudget:
    """The characters and segments one job may have after normalisation, and what it has used so far."""

    max_chars: int | None = None
    max_segments: int | None = None
    chars: int = 0
    segments: int = 0

    def room(self) -> int | None:
        """Return how many more normalised characters fit, or None without a character limit."""
        return None if self.max_chars is None else self.max_chars - self.chars

    def expect_chars(self, at_least: int) -> None:
        """Raise TextOverLimit if at least this many more characters are certain to be over the limit."""
        if self.max_chars is not None and self.chars + at_least > self.max_chars:
            count = self.chars + at_least
            problem = f"is at least {count:,} characters after normalisation (numbers and symbols spelled out)"
            raise TextOverLimit(problem, limit=self.max_chars, setting=CHARS_SETTING)

    def add_chars(self, count: int) -> None:
        """Count normalised characters, raising TextOverLimit once they are over the limit."""
        self.expect_chars(count)
        self.chars += count

    def add_segment(self) -> None:
        """Count one more segment, raising TextOverLimit once they are over the limit."""
        self.segments += 1
        if self.max_segments is not None and self.segments > self.max_segments:
            problem = f"plans into more than {self.max_segments:,} segments"
            raise TextOverLimit(problem, limit=self.max_segments, setting=SEGMENTS_SETTING)
