"""The story the benches read, planned into segments as the API plans it."""

from __future__ import annotations

from devstack.local import ROOT

STORY = ROOT / "bench" / "story_zh.txt"


def planned(text: str) -> list[str]:
    """Plan ``text`` as the API does."""
    from core.settings import load_settings
    from core.text import plan_segments

    settings = load_settings()
    return plan_segments(
        text,
        max_chars=settings.segment_max_chars,
        first_max_chars=settings.first_segment_max_chars,
        language="zh",
    )


def planned_paragraph(text: str, paragraph: int) -> list[str]:
    """Plan one paragraph of ``text`` as it is planned inside the whole text (not the first: no short cap)."""
    from core.settings import load_settings
    from core.text import plan_segments

    cap = load_settings().segment_max_chars
    return plan_segments(text.split("\n\n")[paragraph], max_chars=cap, first_max_chars=cap, language="zh")
