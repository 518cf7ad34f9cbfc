"""What the memory budget may remove, oldest first: finished jobs' audio and sentence-cache entries.

Both are indexed by when they ended (``keys.AUDIO_KEPT``) or were stored (``keys.CACHE_KEPT``; only while the
cache shares the job store's Redis). Removing a job's audio takes what only serves it and notes on its record when
and why, so that its audio routes answer 410 Gone saying so (cache/budget.py decides when and how much).
"""

from __future__ import annotations

from typing import Any

import redis

from cache import keys

#: How many finished jobs' audio (and cache entries) are measured to judge whether a refused job's room can be made.
REMOVABLE_SCAN = 5000

# KEYS: the kept-audio index. ARGV: key prefix, now, then job ids. Removes each job's audio, with what only
# serves it (its texts, timings, events, attempts, claims), notes on its record (if the record is still there)
# when and why, and drops it from the index; returns how many jobs still had audio. The note may fail on a store
# past its limit (pcall): the audio is removed all the same.
_DROP_AUDIO = """
local removed = 0
for i = 3, #ARGV do
  local base = ARGV[1] .. ARGV[i] .. '}:'
  removed = removed + redis.call('DEL', base .. 'audio')
  redis.call('DEL', base .. 'segmeta', base .. 'events', base .. 'texts', base .. 'attempts', base .. 'claims',
             base .. 'pending')
  if redis.call('EXISTS', base .. 'record') == 1 then
    redis.pcall('HSET', base .. 'record', 'audio_removed_at', ARGV[2], 'audio_removed_for', 'memory')
  end
  redis.call('ZREM', KEYS[1], ARGV[i])
end
return removed
"""


class FinishedEntries:
    """Measure and remove the oldest finished audio and cache entries of one Redis."""

    def __init__(self, client: redis.Redis, *, trim_cache: bool = True) -> None:
        self.redis = client
        self.trim_cache = trim_cache  # the sentence cache lives on this Redis (keys.CACHE_KEPT lists it)
        self._drop_audio = client.register_script(_DROP_AUDIO)

    def removable(self, ended_by: float) -> int:
        """Return the memory that finished audio and cache entries which ended by ``ended_by`` hold (of the oldest
        ``REMOVABLE_SCAN`` of each; one pipelined MEMORY USAGE each)."""
        pipe = self.redis.pipeline(transaction=False)
        for member, _ in self._oldest(keys.AUDIO_KEPT, REMOVABLE_SCAN, ended_by):
            pipe.memory_usage(keys.audio(member), samples=0)
        if self.trim_cache:
            for member, _ in self._oldest(keys.CACHE_KEPT, REMOVABLE_SCAN, ended_by):
                pipe.memory_usage(member, samples=0)
        return sum(int(found or 0) for found in pipe.execute())

    def all_removable(self) -> int | None:
        """Return the memory every finished audio and cache entry holds, or None when there are more than
        ``REMOVABLE_SCAN`` of either (too many to measure on a request's path)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(keys.AUDIO_KEPT)
        pipe.zcard(keys.CACHE_KEPT)
        audio, cached = pipe.execute()
        if max(int(audio), int(cached) if self.trim_cache else 0) > REMOVABLE_SCAN:
            return None
        return self.removable(float("inf"))

    def drop_oldest(self, now: float, count: int, *, ended_by: float) -> tuple[int, int, int]:
        """Remove the oldest ``count`` of finished audio and cache entries together, by age, of those that ended
        (or were stored) by ``ended_by``; return how many jobs' audio and cache entries were removed, and how many
        entries the indexes listed."""
        oldest = [(score, "job", member) for member, score in self._oldest(keys.AUDIO_KEPT, count, ended_by)]
        if self.trim_cache:
            oldest += [(score, "cache", member) for member, score in self._oldest(keys.CACHE_KEPT, count, ended_by)]
        oldest = sorted(oldest)[:count]
        jobs = [member for _, kind, member in oldest if kind == "job"]
        cached = [member for _, kind, member in oldest if kind == "cache"]
        removed_jobs = removed_entries = 0
        if jobs:
            removed_jobs = int(
                self._drop_audio(keys=[keys.AUDIO_KEPT], args=[f"{keys.PREFIX}:job:{{", f"{now:.3f}", *jobs])
            )
        if cached:
            pipe = self.redis.pipeline(transaction=False)
            pipe.delete(*cached)
            pipe.zrem(keys.CACHE_KEPT, *cached)
            removed_entries = int(pipe.execute()[0])
        return removed_jobs, removed_entries, len(oldest)

    def _oldest(self, index: str, count: int, ended_by: float) -> list[tuple[str, float]]:
        reply: Any = self.redis.zrangebyscore(index, "-inf", ended_by, start=0, num=count, withscores=True)
        return [(member.decode(), float(score)) for member, score in reply]
