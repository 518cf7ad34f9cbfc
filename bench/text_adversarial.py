"""Time what the API does with a text before admission, on adversarial texts at the longest length accepted.

Run with ``python -m bench.text_adversarial`` (``make bench-text``); the table goes to
``bench/results/text_adversarial.md``. Each input is exactly as long as ``TTS_MAX_TEXT_CHARS`` allows
(the English reference as long as it can be and still be accepted once its numbers are spelled out).
It goes through the request checks (its JSON body parsed by ``api.contract.JobBody``, as
``api.validation.read_body`` does) and the planner as ``api/submission.py`` calls it, limits included,
for a Chinese and an English model. A refused input counts as handled when its error comes back fast.
The process exits 1 if any median is over ``BUDGET_MS``: CPython's ``re`` holds the GIL, so a slow text
stops every request of its API process.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from api.contract import JobBody
from api.validation import contract_error
from bench.report import write_result
from core.errors import ServiceError, ValidationFailed
from core.registry import load_registry
from core.settings import Settings, load_settings
from core.text.chars import has_speakable
from core.text.normalize import normalize
from core.text.plan import paragraphs, plan_segments

BUDGET_MS = 50.0
RUNS = 7
#: A model of each language the registry serves.
MODELS = ("espeak-cmn", "espeak-en")
STORY_ZH = Path(__file__).with_name("story_zh.txt")
PROSE_EN = (
    "The lighthouse keeper climbed the 112 steps at dusk, as she had done every evening since 1998. "
    'Dr. Alvarez, who ran the harbour clinic, said: "It is 7:45, and the fog is early again." '
    "Nobody argued; the boats came in one by one, their lamps swinging, and the town went quiet."
)


def _fill(unit: str, length: int, *, head: str = "", tail: str = "") -> str:
    """Repeat unit between head and tail to exactly length characters."""
    body = length - len(head) - len(tail)
    return head + (unit * (body // len(unit) + 1))[:body] + tail


def inputs(length: int) -> dict[str, str]:
    """Return the adversarial texts, each exactly length characters long, by name."""

    # A run framed by words: a text of nothing but spaces is refused before it is planned.
    def framed(unit: str) -> str:
        return _fill(unit, length, head="开始 start ", tail=" end 结束")

    story = STORY_ZH.read_text(encoding="utf-8")
    return {
        "spaces": framed(" "),
        "tabs": framed("\t"),
        "ideographic spaces (U+3000)": framed("\u3000"),
        "newlines": framed("\n"),
        "spaces and newlines": framed(" \n"),
        "digits": _fill("7", length),
        "digits with spaces": _fill("1 ", length),
        "digit groups 1,234,567…": _fill("234,", length, head="1,"),
        "dotted digits 1.2.3.4…": _fill("1.", length),
        "dots": framed("."),
        "ellipses …": framed("…"),
        "ellipses ...": framed("..."),
        "dots and 。 alternating": framed("。."),
        "hyphens": framed("-"),
        "em dashes —": framed("—"),
        "horizontal bars ―": framed("―"),
        "spaced hyphens": framed(" -"),
        "mixed punctuation !?。，、；": framed("!?。，、；"),
        "closers after spaces": framed("  )"),
        "U+FDFA ﷺ (18 chars each)": framed("\ufdfa"),
        "U+3392 ㎒": framed("\u3392"),
        "ligatures ﬃ": framed("\ufb03"),
        "fullwidth digits １": _fill("１", length),
        "percentages 1%": _fill("1%", length),
        "letter, space": _fill("a ", length),
        "one 20,000-char word": _fill("a", length),
        "Chinese without punctuation": _fill("中", length),
        "abbreviations Mr. ": _fill("Mr. ", length),
        "initials a.a.a.": _fill("a.", length),
        "short paragraphs": _fill("字\n\n", length),
        "paragraphs of marks": _fill("。\n\n", length, head="开始\n\n"),
        "paragraphs of emoji": _fill("😀\n\n", length, head="开始\n\n"),
        "emoji": framed("😀"),
        "combining marks, descending class": _fill("\u0301\u0316", length, head="a"),
        "marks by decomposition (U+0F73)": framed("\u0f73"),
        "month names and spaces": _fill("May ", length),
        "normal Chinese (reference)": _fill(story, length),
        "normal English (reference)": _longest_accepted(PROSE_EN + "\n\n", length),
    }


def _longest_accepted(unit: str, length: int) -> str:
    """Repeat unit to the longest text of at most length characters that stays within length once normalised."""
    text = _fill(unit, length)
    while (longest := max(normalised_length(text, language=language) for language in ("zh", "en"))) > length:
        text = text[: len(text) * length // longest]
    return text


@dataclass(frozen=True)
class Outcome:
    """What the API makes of one text: its segments, or the error it answers with."""

    segments: int
    answer: str


def before_admission(text: str, *, language: str, settings: Settings) -> Outcome:
    """Check and plan text as POST /v1/jobs does before admission; return the segments or the error."""
    try:
        raw = json.dumps({"text": text}, ensure_ascii=False).encode("utf-8", "surrogatepass")
        try:
            job = JobBody.model_validate_json(raw, context={"max_text_chars": settings.max_text_chars})
        except ValidationError as e:
            raise contract_error(e, JobBody) from None
        texts = plan_segments(
            job.text,
            max_chars=settings.segment_max_chars,
            first_max_chars=settings.first_segment_max_chars,
            language=language,
            max_total_chars=settings.max_text_chars,
            max_segments=settings.max_segments,
        )
    except ServiceError as e:
        setting = e.details.get("setting")
        return Outcome(0, f"{e.status} {setting}" if setting else f"{e.status} {e.code}")
    if not texts:
        return Outcome(0, f"{ValidationFailed.status} nothing to say")
    return Outcome(len(texts), "202")


def normalised_length(text: str, *, language: str) -> int:
    """Return how long text is once normalised, without limits (the cost the limits avoid)."""
    return sum(len(n) for n in (normalize(p, language=language) for p in paragraphs(text)) if has_speakable(n))


def timed(work: Callable[[], Outcome], runs: int) -> tuple[Outcome, list[float]]:
    """Run work runs times; return its outcome and each run's milliseconds."""
    times = []
    outcome = work()  # warm: compiled patterns, translation tables
    for _ in range(runs):
        started = time.perf_counter()
        outcome = work()
        times.append((time.perf_counter() - started) * 1000)
    return outcome, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="timed runs per input and language")
    parser.add_argument("--only", default="", help="run only inputs whose name contains this")
    args = parser.parse_args()
    settings = load_settings()
    registry = load_registry(settings)
    languages = [(name, registry.get(name).language) for name in MODELS]
    rows = [
        f"Before admission, at {settings.max_text_chars:,} characters (TTS_MAX_TEXT_CHARS; TTS_MAX_SEGMENTS "
        f"{settings.max_segments:,}), segments of {settings.segment_max_chars} (first "
        f"{settings.first_segment_max_chars}); {args.runs} runs each, budget {BUDGET_MS:g} ms median.",
        "",
        "| input | model (language) | chars in | chars normalised | segments | answer | median ms | max ms |",
        "|---|---|---:|---:|---:|---|---:|---:|",
    ]
    over = []
    for name, text in inputs(settings.max_text_chars).items():
        if args.only not in name:
            continue
        for model, language in languages:
            work = functools.partial(before_admission, text, language=language, settings=settings)
            outcome, times = timed(work, args.runs)
            median, worst = statistics.median(times), max(times)
            if median > BUDGET_MS:
                over.append(f"{name} ({language})")
            rows.append(
                f"| {name} | {model} ({language}) | {len(text):,} | {normalised_length(text, language=language):,} "
                f"| {outcome.segments:,} | {outcome.answer} | {median:.1f} | {worst:.1f} |"
            )
    rows += ["", f"Over {BUDGET_MS:g} ms: {', '.join(over) if over else 'none'}.", ""]
    write_result("text_adversarial", "\n".join(rows))
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
