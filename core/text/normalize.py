"""Turn raw input text into text a TTS model can read aloud."""

import unicodedata

from core.text.clean import drop_unspeakable, join_digit_groups, remove_invisible
from core.text.punctuation import tidy_punctuation
from core.text.verbalize import verbalize_numbers

LANGUAGES = ("auto", "zh", "en")


def normalize(text: str, *, language: str = "auto") -> str:
    """Clean text, spell its numbers in language and unify its punctuation."""
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {LANGUAGES}, got {language!r}")
    text = remove_invisible(text)
    text = join_digit_groups(text)
    text = unicodedata.normalize("NFKC", text)
    text = verbalize_numbers(text, language=language)
    text = drop_unspeakable(text)
    text = tidy_punctuation(text, language=language)
    # Dropping spaces can join a combining mark to its letter ("チ ゙" → "ヂ").
    return unicodedata.normalize("NFC", text)
