"""The Redis key schema, in one place.

Every key of one job shares the hash tag ``{<job id>}`` so the job's Lua
scripts touch a single slot on a Redis Cluster too.
"""

from __future__ import annotations

PREFIX = "tts"


def job(job_id: str) -> str:
    """Return the key of the job's record (a hash of JSON-safe strings)."""
    return f"{PREFIX}:job:{{{job_id}}}:record"


def texts(job_id: str) -> str:
    """Return the key of the job's segment texts (a list, index = segment)."""
    return f"{PREFIX}:job:{{{job_id}}}:texts"


def audio(job_id: str) -> str:
    """Return the key of the job's finished segments (a hash: index → raw 16-bit PCM)."""
    return f"{PREFIX}:job:{{{job_id}}}:audio"


def segment_meta(job_id: str) -> str:
    """Return the key of per-segment metadata (a hash: index → JSON)."""
    return f"{PREFIX}:job:{{{job_id}}}:segmeta"


def attempts(job_id: str) -> str:
    """Return the key counting synthesis attempts per segment (a hash: index → int)."""
    return f"{PREFIX}:job:{{{job_id}}}:attempts"


def events(job_id: str) -> str:
    """Return the key of the job's event log (a stream: segment and status events)."""
    return f"{PREFIX}:job:{{{job_id}}}:events"


def file(job_id: str, fmt: str) -> str:
    """Return the key of the job's whole encoded audio file, built once when asked for."""
    return f"{PREFIX}:job:{{{job_id}}}:file:{fmt}"


def pending(job_id: str) -> str:
    """Return the key of the job's segments not yet enqueued (a list fed into the queue as others finish)."""
    return f"{PREFIX}:job:{{{job_id}}}:pending"


def all_job_keys(job_id: str) -> list[str]:
    """Return every key a job owns except its encoded files, in the order cache/scripts.py expects."""
    return [
        job(job_id), audio(job_id), segment_meta(job_id), events(job_id), texts(job_id), attempts(job_id),
        pending(job_id),
    ]  # fmt: skip


#: A sorted set of jobs not yet finished, scored by creation time, for the reconciler.
LIVE_JOBS = f"{PREFIX}:jobs:live"
#: A sorted set of segments queued or running ("<job id>:<index>"), scored by their playback deadline.
DUE = f"{PREFIX}:sched:due"
#: A hash: model name → measured seconds of audio per character (a moving average).
PACE = f"{PREFIX}:sched:pace"
#: Held by the one worker reconciling at a time.
RECONCILER_LOCK = f"{PREFIX}:reconciler:lock"


def worker(hostname: str) -> str:
    """Return the key of a live worker's heartbeat (a string with a TTL)."""
    return f"{PREFIX}:worker:{hostname}"


#: A sorted set of worker names scored by their last heartbeat.
WORKERS = f"{PREFIX}:workers"


def sentence(digest: str) -> str:
    """Return the key of one cached segment (a hash: pcm, rate, meta)."""
    return f"{PREFIX}:cache:seg:{digest}"


def cached_file(digest: str) -> str:
    """Return the key of one cached whole encoded file."""
    return f"{PREFIX}:cache:file:{digest}"


def idempotency(caller: str, key: str) -> str:
    """Return the key remembering which job an idempotency key created."""
    return f"{PREFIX}:idem:{caller}:{key}"


#: Every stats bucket's key is this and the bucket's number.
STATS = f"{PREFIX}:stats:"


def stats(bucket: int) -> str:
    """Return the key of one 1-second bucket of worker activity (a hash of counters)."""
    return f"{STATS}{bucket}"


BREAKER = f"{PREFIX}:breaker"
