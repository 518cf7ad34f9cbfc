"""Failing the newest live jobs when their audio alone fills the job store, so that the older ones finish.

Admission reserves each job's expected audio (cache/reservations.py), but an estimate can fall short. Then live
work fills the store past its budget's ``write_at``, every segment write waits for room that nothing can make,
and no job can finish. ``shed`` ends that: it fails the newest live jobs, their audio removed with them, until the
store is below ``trim_at`` again (each failed job's record says why). Losing the newest is what admission would
have chosen, had it known. Call it only when the live jobs' audio is what fills the store (``live_audio_bytes``):
failing jobs cannot free memory that records or other keys hold.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from cache import keys
from cache.budget import StoreBudget
from cache.job_reads import as_str
from core.metrics import STORE_TRIMMED

#: The most live jobs one shedding pass fails (a pass reads the used memory again after each).
SHED_MAX = 64
#: How many of the newest live jobs' audio is measured to judge whether failing them would make room.
SHED_SCAN = 2000
#: What a job failed by ``shed`` says, with the store's usage.
SHED_REASON = (
    "the job store's memory ({usage}) filled with the audio of jobs still being made, with no finished audio left "
    "to remove, so none of them could go on: the newest were failed so that older ones can finish. Submit it again "
    "later; to make room for more work at once, raise the store's budget (maxmemory; make run: TTS_REDIS_MAXMEMORY)"
)


def live_audio_bytes(client: redis.Redis, *, newest: int = SHED_SCAN) -> int:
    """Return the memory the audio of the ``newest`` live jobs holds (one pipelined MEMORY USAGE each)."""
    pipe = client.pipeline(transaction=False)
    for raw in client.zrevrange(keys.LIVE_JOBS, 0, newest - 1):
        pipe.memory_usage(keys.audio(as_str(raw)), samples=0)
    return sum(int(found or 0) for found in pipe.execute())


def shed(budget: StoreBudget, fail: Callable[[str, str, bool], bool], *, at_most: int = SHED_MAX) -> list[str]:
    """Fail the newest live jobs, one at a time, until the store is below ``trim_at``; return those failed.

    Call it only when live work fills the store past ``write_at`` and a trim found nothing finished to remove.
    Each job's audio is removed in the same step as its failure, and only while it is live.
    ``fail(job_id, reason, drop_audio)`` ends a job (``JobStore.fail``); at the limit, where that step's
    writes are refused, the audio is removed first on its own (a deletion always passes).
    """
    failed_jobs: list[str] = []
    for raw in budget.redis.zrevrange(keys.LIVE_JOBS, 0, at_most - 1):
        usage = budget.usage()
        if not usage.budget or usage.share < budget.trim_at:
            break
        job_id = as_str(raw)
        reason = SHED_REASON.format(usage=usage.describe())
        try:
            failed = fail(job_id, reason, True)
        except redis.OutOfMemoryError:
            budget.redis.delete(keys.audio(job_id))
            failed = fail(job_id, reason, True)
        if failed:
            failed_jobs.append(job_id)
    STORE_TRIMMED.labels("live_job").inc(len(failed_jobs))
    return failed_jobs
