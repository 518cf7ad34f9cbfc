"""Recent worker throughput and outcomes, in 1-second buckets shared through Redis.

Workers add what each engine call did; the API reads the last minute to
estimate queue waits (admission) and failure rates (circuit breaker).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import redis

from cache import keys, scripts

BUCKET_S = 1
WINDOW_S = 60
#: How old a window the API's admission and breaker may answer from (see ``Stats``).
API_MAX_AGE_S = 0.5
#: What a model's own figures are kept under in a bucket: "<model>|<figure>" (model names never hold it).
MODEL_SEP = "|"
#: The figures also kept per model: how fast its first audio comes, which differs by model and mode (a fast
#: variant's first segments say nothing of a quality one's).
PER_MODEL = ("firsts", "first_chars", "first_s", "solo_chars", "solo_s")


@dataclass(frozen=True)
class Window:
    """What workers did in a recent window."""

    chars: float = 0.0
    busy_s: float = 0.0
    segments: float = 0.0
    calls: float = 0.0
    #: Engine calls' seconds to their segments' first fragments (each call's mean): when a listener hears a segment.
    heard_s: float = 0.0
    ok: float = 0.0
    failed: float = 0.0
    #: Realtime jobs' first segments made by the engines: how many, their characters, and the seconds each took in
    #: its worker to its first fragment (its wait for a batch and its engine call's first steps: nearly all of its
    #: listener's wait for the first audio).
    firsts: float = 0.0
    first_chars: float = 0.0
    first_s: float = 0.0
    #: Engine calls that carried one segment: their characters and the seconds to their first fragment (the whole
    #: call when it made one), the pace of a first audio made alone.
    solo_chars: float = 0.0
    solo_s: float = 0.0
    #: The same window's PER_MODEL figures of each model (its variant's name) that recorded any.
    by_model: Mapping[str, Window] = field(default_factory=dict)

    @classmethod
    def summed(cls, figures: Mapping[str, float]) -> Window:
        """Return the window of a bucket sum's figures (missing ones are 0; models' figures are not read)."""
        known: dict[str, Any] = {f.name: figures[f.name] for f in fields(cls) if f.name in figures}
        return cls(**known)

    def of(self, model: str) -> Window:
        """Return ``model``'s own PER_MODEL figures in this window (nothing when it recorded none)."""
        return self.by_model.get(model) or Window()

    @property
    def chars_per_busy_second(self) -> float:
        """Return one worker's speed while busy, in characters per second (0 when unknown)."""
        return self.chars / self.busy_s if self.busy_s > 0 else 0.0

    @property
    def seconds_per_call(self) -> float:
        """Return the mean duration of one engine call (0 when unknown): the least a segment takes to be made."""
        return self.busy_s / self.calls if self.calls else 0.0

    @property
    def seconds_to_audio(self) -> float:
        """Return how long after an engine call starts its segments' listeners hear them (their first fragments),
        on average; the whole call where workers did not say (0 when unknown)."""
        return self.heard_s / self.calls if self.calls and self.heard_s > 0 else self.seconds_per_call

    @property
    def chars_per_segment(self) -> float:
        """Return the mean characters per segment (0 when unknown)."""
        return self.chars / self.segments if self.segments else 0.0

    @property
    def first_audio_s_per_char(self) -> float:
        """Return the seconds recent first segments took to be made, per character (0 when unknown)."""
        return self.first_s / self.first_chars if self.first_chars > 0 else 0.0

    @property
    def solo_s_per_char(self) -> float:
        """Return the seconds a one-segment engine call took to its first fragment, per character (0 when none was
        made lately)."""
        return self.solo_s / self.solo_chars if self.solo_chars > 0 else 0.0

    @property
    def failure_rate(self) -> float:
        """Return the share of segment attempts that failed."""
        total = self.ok + self.failed
        return self.failed / total if total else 0.0


class Stats:
    """Record and read recent worker activity.

    ``max_age_s`` lets a reader answer from a window it summed that recently (the API: every submission reads the
    last minute, twice, and each read sums 61 buckets inside Redis, the one server every process shares; kept for
    half a second, a process sums it twice a second at most, whatever its rate of submissions).
    """

    def __init__(self, client: redis.Redis, *, max_age_s: float = 0.0) -> None:
        self.redis = client
        self._sum = client.register_script(scripts.SUM_BUCKETS)
        self.max_age_s = max_age_s
        self._summed: dict[tuple[int, int], tuple[float, Window]] = {}

    def record(
        self, *, chars: int = 0, busy_s: float = 0.0, segments: int = 0, calls: int = 0, ok: int = 0, failed: int = 0,
        first_chars: int = 0, first_s: float = 0.0, solo_chars: int = 0, solo_s: float = 0.0, heard_s: float = 0.0,
        model: str = "",
    ) -> None:  # fmt: skip
        """Add one engine call's work, or one segment's outcome (with a realtime first segment's characters and the
        seconds it took to make), to the current bucket; the PER_MODEL figures also under ``model`` when given."""
        key = keys.stats(int(time.time()) // BUCKET_S)
        pipe = self.redis.pipeline(transaction=False)
        for name, value in (("chars", chars), ("busy_s", busy_s), ("segments", segments), ("calls", calls),
                            ("heard_s", heard_s), ("ok", ok), ("failed", failed), ("firsts", 1 if first_chars else 0),
                            ("first_chars", first_chars), ("first_s", first_s), ("solo_chars", solo_chars),
                            ("solo_s", solo_s)):  # fmt: skip
            if value:
                pipe.hincrbyfloat(key, name, value)
                if model and name in PER_MODEL:
                    pipe.hincrbyfloat(key, f"{model}{MODEL_SEP}{name}", value)
        pipe.expire(key, WINDOW_S * 3)
        pipe.execute()

    def window(self, *, since: float | None = None, seconds: int = WINDOW_S) -> Window:
        """Sum the buckets of the last ``seconds`` (or since ``since``, if later)."""
        now = time.time()
        start = now - seconds
        return self.between(start if since is None else max(start, since), now)

    def between(self, start: float, end: float) -> Window:
        """Sum the buckets from the one holding ``start`` to the one holding ``end`` (Unix seconds), both in."""
        span = (int(start) // BUCKET_S, int(end) // BUCKET_S)
        now = time.monotonic()
        if self.max_age_s > 0:
            kept = self._summed.get(span)
            if kept is not None and now - kept[0] < self.max_age_s:
                return kept[1]
        # Summed in Redis: one round trip and a few fields back, however long the window.
        flat = self._sum(args=[keys.STATS, *span])
        totals = {_text(flat[i]): float(flat[i + 1]) for i in range(0, len(flat), 2)}
        by_model: dict[str, dict[str, float]] = {}
        for name, value in totals.items():
            model, sep, figure = name.rpartition(MODEL_SEP)
            if sep and figure in PER_MODEL:
                by_model.setdefault(model, {})[figure] = value
        window = replace(
            Window.summed(totals), by_model={model: Window.summed(figures) for model, figures in by_model.items()}
        )
        if self.max_age_s > 0:
            self._summed = {k: v for k, v in self._summed.items() if now - v[0] < self.max_age_s}
            self._summed[span] = (now, window)
        return window


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
