"""The Redis key schema, in one place.

Every key of one job shares the hash tag ``{<job id>}`` so the job's Lua
scripts touch a single slot on a Redis Cluster too.

Declared boilerplate: one small function per key, each the same shape, so the schema reads as a list.
"""

from __future__ import annotations

import hashlib

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


def fragments(job_id: str) -> str:
    """Return the key of the fragments of segments being made (a hash: ``<index>`` → how many are written,
    ``<index>:<n>`` → fragment n's raw 16-bit PCM, ``<index>:at`` → when fragment 0 was written); a segment's
    fragments leave it when the segment is written, which holds them joined."""
    return f"{PREFIX}:job:{{{job_id}}}:frags"


def segment_meta(job_id: str) -> str:
    """Return the key of per-segment metadata (a hash: index → JSON)."""
    return f"{PREFIX}:job:{{{job_id}}}:segmeta"


def attempts(job_id: str) -> str:
    """Return the key counting synthesis attempts per segment (a hash: index → attempts started, and
    ``failed_field(index)`` → those of them that failed)."""
    return f"{PREFIX}:job:{{{job_id}}}:attempts"


def failed_field(index: int) -> str:
    """Return the field of the attempts hash that counts a segment's failed attempts (START_SEGMENT reads it)."""
    return f"{index}:failed"


def events(job_id: str) -> str:
    """Return the key of the job's event log (a stream: segment and status events)."""
    return f"{PREFIX}:job:{{{job_id}}}:events"


def pending(job_id: str) -> str:
    """Return the key of the job's segments not yet enqueued (a list fed into the queue as others finish)."""
    return f"{PREFIX}:job:{{{job_id}}}:pending"


def claims(job_id: str) -> str:
    """Return the key of each segment's current delivery (a hash: index → the token of the attempt running it)."""
    return f"{PREFIX}:job:{{{job_id}}}:claims"


def text_pieces(job_id: str) -> str:
    """Return the key of a text stream's pieces as they arrived (a hash: seq → text; retries are checked on it)."""
    return f"{PREFIX}:job:{{{job_id}}}:pieces"


def text_lock(job_id: str) -> str:
    """Return the key of the short lock that lets one piece of a text stream at a time be planned."""
    return f"{PREFIX}:job:{{{job_id}}}:textlock"


def all_job_keys(job_id: str) -> list[str]:
    """Return every key a job owns except its encoded files, in the order cache/scripts.py expects."""
    return [
        job(job_id), audio(job_id), segment_meta(job_id), events(job_id), texts(job_id), attempts(job_id),
        pending(job_id), claims(job_id),
    ]  # fmt: skip


def segment_member(job_id: str, index: int) -> str:
    """Return how sets of segments across jobs name one segment ("<job id>:<index>")."""
    return f"{job_id}:{index}"


def parse_segment_member(member: str | bytes) -> tuple[str, int]:
    """Split a ``segment_member`` back into its job id and index."""
    text = member.decode() if isinstance(member, bytes) else member
    job_id, _, index = text.rpartition(":")
    return job_id, int(index)


#: A sorted set of jobs not yet finished, scored by creation time, for the reconciler.
LIVE_JOBS = f"{PREFIX}:jobs:live"
#: Open text streams (a sorted set: job id → when its last piece arrived), for the idle cut-off and idle end.
TEXT_STREAMS = f"{PREFIX}:jobs:textstreams"
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
#: A set of the workers that may hold segments (each has a ``held`` set), so a dead one is found even
#: after its heartbeat entry was pruned.
HOLDERS = f"{PREFIX}:holders"


def held(hostname: str) -> str:
    """Return the key of the segments a worker has started and not yet written (a set of segment members)."""
    return f"{PREFIX}:held:{hostname}"


#: A sorted set of segments that must be published to the broker, scored by when a sweeper may publish them:
#: every segment taken off a job's pending list, or taken from a dead worker, passes through it (an outbox).
OUTBOX = f"{PREFIX}:outbox"
#: The audio live jobs may still write, in bytes (an integer): the sum of their records' ``owed_bytes``, which
#: admission adds to the memory used when it judges whether a new job's audio fits (cache/reservations.py).
STORE_OWED = f"{PREFIX}:budget:owed"
#: The room the largest job refused lately for want of it needs (a hash with a TTL of
#: ``cache.reservations.WANTED_FOR_S``: ``mark``, the most used and reserved memory may be for it to fit; ``need``,
#: its audio; ``lane``): the janitor's trim makes that room from older finished audio.
STORE_WANTED = f"{PREFIX}:budget:wanted"
#: The difference between that total and the live jobs' records that the last recount found and left.
STORE_OWED_DRIFT = f"{PREFIX}:budget:owed:drift"
#: Recent audio bytes and characters per model (a hash: "<model>:bytes", "<model>:chars", decaying sums), from
#: which a new job's audio is estimated.
BYTES_PER_CHAR = f"{PREFIX}:budget:bytes_per_char"
#: Held by the one worker failing live jobs to make room in a full store at a time (cache/shedding.py).
SHED_LOCK = f"{PREFIX}:budget:shed:lock"
#: Held by the one worker trimming finished audio at a time (cache/budget.py), while it trims.
TRIM_LOCK = f"{PREFIX}:budget:trim:lock"
#: Held by the one worker sweeping the outbox and dead workers at a time.
JANITOR_LOCK = f"{PREFIX}:janitor:lock"

#: Finished jobs whose audio may still be in the store, scored by when they ended: the memory budget
#: removes the oldest first (cache/budget.py).
AUDIO_KEPT = f"{PREFIX}:audio:kept"
#: Sentence-cache entries (segments and whole files) scored by when they were stored, when the cache
#: shares the job store's Redis: the memory budget removes the oldest first.
CACHE_KEPT = f"{PREFIX}:cache:kept"


def sentence(digest: str) -> str:
    """Return the key of one cached segment (a hash: pcm, rate, meta)."""
    return f"{PREFIX}:cache:seg:{digest}"


def cached_file(digest: str) -> str:
    """Return the key of one cached whole encoded file."""
    return f"{PREFIX}:cache:file:{digest}"


def _pair(first: str, second: str) -> str:
    """Hash two strings as a pair, each part length-prefixed: a caller id may hold ':' (an IPv6 address), so plain
    joining would let caller ``ip-::1`` with ``a`` and caller ``ip-:`` with ``:1:a`` share a key."""
    material = f"{len(first)}:{first}{len(second)}:{second}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(material).hexdigest()


def idempotency(caller: str, key: str) -> str:
    """Return the key remembering which job a caller's idempotency key created (hashed as a pair)."""
    return f"{PREFIX}:idem:{_pair(caller, key)}"


def refusal(caller: str, digest: str) -> str:
    """Return the key remembering that a caller's request (by its body's digest) was refused at the door."""
    return f"{PREFIX}:{{refused}}:{_pair(caller, digest)}"


#: The refusals made because the engines were past capacity, whose retries are still to come (a sorted set:
#: refusal key → when it is forgotten); its hash tag is every refusal key's, so one script reads both.
REFUSALS_PENDING = f"{PREFIX}:{{refused}}:pending"


#: Every stats bucket's key is this and the bucket's number.
STATS = f"{PREFIX}:stats:"


def stats(bucket: int) -> str:
    """Return the key of one 1-second bucket of worker activity (a hash of counters)."""
    return f"{STATS}{bucket}"


BREAKER = f"{PREFIX}:breaker"


def streams(caller: str) -> str:
    """Return the key of a caller's open streams (a sorted set: slot id → when it lapses unless renewed, in ms)."""
    return f"{PREFIX}:streams:{caller}"


#: A key rewritten before each Redis WAIT: WAIT counts the replicas that hold a connection's last write, so the
#: write that comes right before it makes the wait cover everything written before it, by any client.
REPLICATION_MARK = f"{PREFIX}:replication:mark"
