"""The schedule's shared state in Redis: outstanding segments by deadline, and each model's pace."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import redis

from cache import keys

#: Weight of a new observation in a model's seconds-per-character average.
_PACE_WEIGHT = 0.1


class ScheduleBook:
    """Outstanding segments scored by deadline (for admission) and measured seconds of audio per character."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        default_seconds_per_char: float,
        due_key: str = keys.DUE,
        pace_key: str = keys.PACE,
    ) -> None:
        self.redis = client
        self.default_seconds_per_char = default_seconds_per_char
        self.due_key = due_key
        self.pace_key = pace_key

    def add(self, job_id: str, deadlines: Mapping[int, float]) -> None:
        """Record queued segments with their deadlines."""
        if deadlines:
            self.redis.zadd(self.due_key, {keys.segment_member(job_id, i): d for i, d in deadlines.items()})

    def remove(self, job_id: str, indexes: Iterable[int]) -> None:
        """Forget segments that were written, or whose job ended."""
        members = [keys.segment_member(job_id, i) for i in indexes]
        if members:
            self.redis.zrem(self.due_key, *members)

    def due_by(self, when: float) -> int:
        """Return how many outstanding segments are due no later than ``when``."""
        return int(self.redis.zcount(self.due_key, "-inf", when))

    def window(self, since: float, until: float, *, limit: int) -> tuple[list[float], int, int]:
        """Return, in one round trip: the deadlines (oldest first) of up to ``limit`` outstanding segments due in
        [since, until], how many segments are outstanding, and how many are due before ``since``."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrangebyscore(self.due_key, since, until, start=0, num=limit, withscores=True)
        pipe.zcard(self.due_key)
        pipe.zcount(self.due_key, "-inf", f"({since}")
        found, outstanding, overdue = pipe.execute()
        return [float(score) for _, score in found], int(outstanding), int(overdue)

    def outstanding(self) -> int:
        """Return how many segments are outstanding (queued, held by a worker or running)."""
        return int(self.redis.zcard(self.due_key))

    def overdue_since(self, before: float, limit: int = 500) -> list[tuple[str, int]]:
        """Return up to ``limit`` outstanding (job id, index) pairs due before ``before``, oldest first."""
        raw = self.redis.zrangebyscore(self.due_key, "-inf", before, start=0, num=limit)
        return [keys.parse_segment_member(value) for value in raw]  # type: ignore[arg-type]

    def seconds_per_char(self, model: str) -> float:
        """Return the model's measured seconds of audio per character (the default until measured)."""
        value = self.redis.hget(self.pace_key, model)
        return self.default_seconds_per_char if value is None else float(value)  # type: ignore[arg-type]

    def observe(self, model: str, *, chars: int, audio_s: float) -> None:
        """Fold one finished segment into the model's pace (a moving average; races only blur it)."""
        if chars <= 0 or audio_s <= 0:
            return
        seen = audio_s / chars
        value = self.redis.hget(self.pace_key, model)
        new = seen if value is None else float(value) + _PACE_WEIGHT * (seen - float(value))  # type: ignore[arg-type]
        self.redis.hset(self.pace_key, model, f"{new:.5f}")
