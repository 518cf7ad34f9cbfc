"""The job store's memory budget: how full Redis is, and making room.

The budget is Redis's own ``maxmemory`` (or ``TTS_STORE_BUDGET_MB``). Live jobs are never touched. Past
``trim_at`` of it, the oldest finished jobs' audio and the oldest sentence-cache entries (when the cache
shares this Redis) are removed, oldest first, down to ``trim_at - TRIM_MARGIN``; the jobs' records stay,
so their audio routes answer 410 Gone saying why. Admission refuses (503) a job whose expected audio, beside
the memory used and what live jobs have reserved, would pass ``full_at`` (cache/reservations.py), and trimming
counts the reservations as used too, so that Redis never reaches the limit where it refuses writes. Segment
writes wait past ``write_at``.

An estimate can fall short (a model whose audio grew, a Redis whose other keys grew): then live work fills the
store past ``write_at``, every segment write waits for room that nothing can make, and no job can finish.
Shedding ends that (cache/shedding.py). What may be removed, and removing it, is cache/finished.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from cache import keys
from cache.finished import FinishedEntries
from core.errors import SettingsInvalid
from core.metrics import STORE_RESERVED, STORE_TRIMMED, STORE_USED
from core.settings import Settings

#: Room for the audio live jobs have reserved, or for a job refused lately, is made only from audio that ended at
#: least this long ago (``trim``): a caller told its job is done has that long to fetch the rest (a streaming
#: caller has most of it by then). Room for audio written is made from any.
RESERVED_ROOM_AGE_S = 15.0
#: Trimming goes this far below the trim mark, so that it runs in bursts rather than on every write.
TRIM_MARGIN = 0.1
#: Entries removed in the first round trip of a trim, then the used memory is read again; each further
#: round removes twice as many, up to TRIM_BATCH_MAX.
TRIM_BATCH = 4
TRIM_BATCH_MAX = 512


@dataclass(frozen=True)
class Usage:
    """The job store's used memory and budget, and the audio live jobs have reserved and not yet written
    (cache/reservations.py), in bytes (budget 0: none set)."""

    used: int
    budget: int
    owed: int = 0
    #: The most used and reserved memory together may be for a job refused lately to fit (None: none waits).
    wanted: int | None = None

    @property
    def share(self) -> float:
        """Return the used share of the budget (0 without one)."""
        return self.used / self.budget if self.budget else 0.0

    @property
    def projected_share(self) -> float:
        """Return the share of the budget that will be used once live jobs have written what they reserved."""
        return (self.used + self.owed) / self.budget if self.budget else 0.0

    def describe(self) -> str:
        """Say how full the store is, for logs and error messages."""
        if not self.budget:
            return f"{self.used / 2**20:.0f} MB used, no budget"
        owed = f", {self.owed / 2**20:.0f} MB more reserved by live jobs" if self.owed else ""
        return f"{self.used / 2**20:.0f} of {self.budget / 2**20:.0f} MB ({self.share:.0%}){owed}"


@dataclass(frozen=True)
class Trimmed:
    """What one trim removed."""

    jobs: int = 0
    cache_entries: int = 0
    before: Usage | None = None
    after: Usage | None = None


class StoreBudget:
    """Read the store's memory use against its budget; trim finished audio; say when it is full."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        budget_bytes: int = 0,
        trim_at: float = 0.8,
        full_at: float = 0.9,
        audio_ttl_s: int = 3600,
        cache_ttl_s: int = 7 * 24 * 3600,
        trim_cache: bool = True,
        read_every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = client
        self.budget_bytes = budget_bytes
        self.trim_at = trim_at
        self.full_at = full_at
        self.audio_ttl_s = audio_ttl_s
        self.cache_ttl_s = cache_ttl_s
        self.read_every_s = read_every_s
        self._clock = clock
        # What may be removed: the sentence cache's entries too while it lives on this Redis.
        self.finished = FinishedEntries(client, trim_cache=trim_cache)
        self._lock = threading.Lock()
        self._last: tuple[float, Usage] | None = None
        self._kept: tuple[float, int | None] | None = None

    def usage(self) -> Usage:
        """Read the used memory (as Redis counts it against maxmemory), the budget and the audio reserved, now."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.info("memory")
        pipe.get(keys.STORE_OWED)
        pipe.hget(keys.STORE_WANTED, "mark")
        info, owed, wanted = pipe.execute()
        used = int(info.get("used_memory", 0)) - int(info.get("mem_not_counted_for_evict", 0))
        budget = self.budget_bytes or int(info.get("maxmemory", 0))
        found = Usage(max(0, used), budget, max(0, int(owed or 0)), None if wanted is None else max(0, int(wanted)))
        STORE_USED.set(found.share)
        STORE_RESERVED.set(found.owed / budget if budget else 0.0)
        with self._lock:
            self._last = (self._clock(), found)
        return found

    def recent(self) -> Usage:
        """Return the usage read at most ``read_every_s`` ago (one INFO a second per process, not per request)."""
        with self._lock:
            last = self._last
        if last is not None and self._clock() - last[0] < self.read_every_s:
            return last[1]
        return self.usage()

    @property
    def write_at(self) -> float:
        """Return the share past which segment writes wait: halfway from ``full_at`` to the limit, so that running
        jobs go on after admission stops, and the broker's and the workers' own writes always find room."""
        return self.full_at + (1.0 - self.full_at) / 2

    def room_to_write(self) -> bool:
        """Say whether a segment may be written now (the store is below ``write_at``): read at most once a second
        while the store is below ``full_at``, and at every write past it, where a stale reading lets a whole engine
        call's audio through at once."""
        usage = self.recent()
        if usage.budget and usage.share >= self.full_at:
            usage = self.usage()
        return not usage.budget or usage.share < self.write_at

    def trim(self, now: float | None = None) -> Trimmed:
        """Forget index entries whose TTL removed them; past ``trim_at``, remove the oldest finished audio and
        cache entries down to ``trim_at - TRIM_MARGIN``. Return what was removed.

        Judged twice. First on the memory used, removing entries of any age. Then on what will be used once live
        jobs have written what they reserved, so that admission, which counts it too, finds room for new work: down
        below ``trim_at - TRIM_MARGIN`` once past ``trim_at``, and as far as a job refused lately needs to fit
        (``Usage.wanted``, which admission records). That second pass removes only what ended
        ``RESERVED_ROOM_AGE_S`` ago or more: a reservation is an estimate (cautious until a model has written some
        audio), and audio a caller has just been told is ready is not traded for audio not yet written."""
        now = time.time() if now is None else now
        pipe = self.redis.pipeline(transaction=False)
        pipe.zremrangebyscore(keys.AUDIO_KEPT, "-inf", now - self.audio_ttl_s)
        pipe.zremrangebyscore(keys.CACHE_KEPT, "-inf", now - self.cache_ttl_s)
        pipe.execute()
        before = usage = self.usage()
        low = max(0.0, self.trim_at - TRIM_MARGIN)
        jobs = entries = 0
        if usage.budget and usage.share >= self.trim_at:
            usage, jobs, entries = self._trim_down(usage, lambda u: u.share, low, ended_by=now, now=now)
        ended_by = now - RESERVED_ROOM_AGE_S
        target = low if usage.projected_share >= self.trim_at else 1.0
        wanted = usage.wanted
        # A refused job's mark, when not met yet and finished audio can reach it (below it, removing all of it would
        # admit nothing; the scan of what removal frees runs only then).
        if (
            wanted is not None
            and usage.budget
            and usage.used + usage.owed > wanted
            and wanted / usage.budget < target
            and self._reaches(usage, wanted, ended_by)
        ):
            target = wanted / usage.budget
        if usage.budget and usage.projected_share > target:
            usage, more_jobs, more_entries = self._trim_down(
                usage, lambda u: u.projected_share, target, ended_by=ended_by, now=now
            )
            jobs, entries = jobs + more_jobs, entries + more_entries
        STORE_TRIMMED.labels("job_audio").inc(jobs)
        STORE_TRIMMED.labels("cache_entry").inc(entries)
        return Trimmed(jobs, entries, before, usage)

    def _trim_down(
        self, usage: Usage, share: Callable[[Usage], float], low: float, *, ended_by: float, now: float
    ) -> tuple[Usage, int, int]:
        """Remove the oldest entries that ended by ``ended_by`` until ``share`` is at most ``low`` or none is left;
        return the usage then, and how many jobs' audio and cache entries went."""
        jobs = entries = 0
        batch = TRIM_BATCH
        while share(usage) > low:
            removed_jobs, removed_entries, listed = self.finished.drop_oldest(now, batch, ended_by=ended_by)
            batch = min(TRIM_BATCH_MAX, 2 * batch)
            if not listed:
                break  # nothing finished is left: live work fills the budget (admission refuses past full_at)
            jobs += removed_jobs
            entries += removed_entries
            usage = self.usage()
        return usage, jobs, entries

    def _reaches(self, usage: Usage, mark: int, ended_by: float) -> bool:
        """Say whether removing the finished audio and cache entries that ended by ``ended_by`` would bring used and
        reserved memory to ``mark``."""
        return usage.used + usage.owed - self.finished.removable(ended_by) <= mark

    def kept_for_good(self) -> int | None:
        """Return the memory used that no trim can free and no job's end will: job records, queues, Redis's own
        (what a new job's audio must always fit beside); None while a job is live, whose end may free room, or
        when there is too much finished audio to measure. Measured at most once per ``read_every_s`` a process: a
        burst of refusals does not scan the finished audio once each."""
        with self._lock:
            last = self._kept
        if last is not None and self._clock() - last[0] < self.read_every_s:
            return last[1]
        found = None
        if not self.redis.zcard(keys.LIVE_JOBS):
            removable = self.finished.all_removable()
            found = None if removable is None else max(0, self.usage().used - removable)
        with self._lock:
            self._kept = (self._clock(), found)
        return found

    def wait_for_room(self, timeout_s: float, *, poll_s: float = 0.5) -> bool:
        """Block until the store is below its mark for segment writes again (``write_at``), up to ``timeout_s``.

        Polls the used memory: room is made by other processes (a janitor's trim or shed, TTLs expiring). The mark
        is the one writes wait at: a lower one would leave every writer waiting in between, with nothing to shed.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            usage = self.usage()
            if not usage.budget or usage.share < self.write_at:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(poll_s, left))


def check_no_eviction(client: redis.Redis) -> None:
    """Raise SettingsInvalid when the job store's Redis may evict keys (its maxmemory-policy is not noeviction).

    An evicting Redis drops queued tasks, job records and audio without a word when it fills: accepted jobs would
    vanish. A Redis not reachable yet is not judged here (the service waits for it as for any outage).
    """
    try:
        policy = str(client.info("memory").get("maxmemory_policy", "noeviction"))
    except redis.RedisError:
        return
    if policy != "noeviction":
        raise SettingsInvalid(
            f"the job store's Redis (REDIS_URL) has maxmemory-policy {policy}: it would evict queued tasks, jobs and "
            "audio when full, and accepted jobs would vanish. Set `maxmemory-policy noeviction` on it (the service "
            "keeps itself inside maxmemory: README 'Memory'); an evicting cache belongs on TTS_CACHE_REDIS_URL"
        )


def build_budget(client: redis.Redis, settings: Settings) -> StoreBudget:
    """Return the job store's budget as the settings configure it."""
    return StoreBudget(
        client,
        budget_bytes=settings.store_budget_mb * 2**20,
        trim_at=settings.store_trim_at,
        full_at=settings.store_full_at,
        audio_ttl_s=settings.audio_ttl_s,
        cache_ttl_s=settings.cache_ttl_s,
        trim_cache=settings.cache_redis_url in (None, "", settings.redis_url),
    )
