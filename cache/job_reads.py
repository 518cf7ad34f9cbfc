"""Reading a job from Redis: its record, texts and finished audio, and waiting on its event stream."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from cache import keys
from cache.events import EventWaiter
from cache.records import JobRecord, JobStatus
from core.audio import PackedAudio


def as_text(value: object) -> str | None:
    """Decode a reply of a client made without decode_responses (bytes, or None when absent)."""
    return None if value is None else as_bytes(value).decode()


def as_str(value: object) -> str:
    """Decode a reply of a client made without decode_responses that is known to be there (bytes)."""
    return as_bytes(value).decode()


def as_bytes(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError(f"expected bytes from Redis, got {type(value).__name__}")
    return value


def pairs(flat: list[Any]) -> dict[bytes, bytes]:
    return {as_bytes(flat[i]): as_bytes(flat[i + 1]) for i in range(0, len(flat), 2)}


def record_of(raw: dict[Any, Any]) -> JobRecord | None:
    """Parse a record's hash as read (bytes), or None when it is no job (see ``JobRecord.parse``)."""
    return JobRecord.parse({as_bytes(k).decode(): as_bytes(v).decode() for k, v in raw.items()})


@dataclass(frozen=True)
class Fragments:
    """Fragments ``first``, ``first+1``, … of one segment as found (raw 16-bit PCM each), and whether they are its
    last: the segment is written, and holds every fragment joined."""

    first: int
    pcm: list[bytes]
    complete: bool


def fragment_bounds(meta: dict[str, Any], pcm_bytes: int) -> list[int]:
    """Return the byte offsets of a written segment's fragments in its PCM (one fragment when it has no record)."""
    lengths = [int(n) * 2 for n in meta.get("fragments") or ()]
    if not lengths or sum(lengths) != pcm_bytes:
        return [0, pcm_bytes]
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return offsets


class JobReads:
    """The job store's reads; JobStore adds the atomic changes."""

    redis: redis.Redis
    #: Shares one blocked connection among every wait (cache/events.py); None blocks in the caller's thread.
    waiter: EventWaiter | None

    def pending(self, job_id: str) -> list[int]:
        """Return the segments still waiting to be enqueued."""
        return [int(as_bytes(v)) for v in self.redis.lrange(keys.pending(job_id), 0, -1)]

    def live_jobs(self) -> list[str]:
        """Return the ids of jobs not known to be finished, oldest first."""
        return [as_bytes(v).decode() for v in self.redis.zrange(keys.LIVE_JOBS, 0, -1)]

    def missing_segments(self, job_id: str, total: int) -> list[int]:
        """Return the indexes of segments not written yet."""
        done = {int(as_bytes(k)) for k in self.redis.hkeys(keys.audio(job_id))}
        return [i for i in range(total) if i not in done]

    def get(self, job_id: str) -> JobRecord | None:
        """Return the job's record, or None when there is no such job."""
        return record_of(self.redis.hgetall(keys.job(job_id)))

    def get_with_meta(self, job_id: str) -> tuple[JobRecord | None, dict[int, dict[str, Any]]]:
        """Return the job's record and every finished segment's metadata, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.job(job_id))
        pipe.hgetall(keys.segment_meta(job_id))
        raw, meta = pipe.execute()
        return record_of(raw), {int(k): json.loads(v) for k, v in meta.items()}

    def texts(self, job_id: str) -> list[str]:
        """Return every segment text of the job, in order."""
        return [as_bytes(t).decode() for t in self.redis.lrange(keys.texts(job_id), 0, -1)]

    def has_segment(self, job_id: str, index: int) -> bool:
        """Say whether a segment's audio is already written."""
        return bool(self.redis.hexists(keys.audio(job_id), str(index)))

    def attempts(self, job_id: str, index: int) -> int:
        """Return how many synthesis attempts a segment has had."""
        return int(self.redis.hget(keys.attempts(job_id), str(index)) or 0)

    def failures(self, job_id: str, index: int) -> int:
        """Return how many attempts of a segment failed (its engine raised, or its worker died holding it)."""
        return int(self.redis.hget(keys.attempts(job_id), keys.failed_field(index)) or 0)

    def segment(self, job_id: str, index: int) -> bytes | None:
        """Return a finished segment's PCM bytes, or None when not ready (or no longer kept)."""
        packed = self.packed_segment(job_id, index)
        return None if packed is None else packed.pcm()

    def packed_segment(self, job_id: str, index: int) -> PackedAudio | None:
        """Return a finished segment as the store keeps it (to copy it on without decoding it)."""
        value = self.redis.hget(keys.audio(job_id), str(index))
        return None if value is None else PackedAudio(as_bytes(value))

    def fragments(self, job_id: str, index: int, first: int = 0) -> Fragments:
        """Return a segment's fragments from ``first`` on: those written so far while it is being made, or, once it
        is written, the rest of it cut where its fragments were (the two never disagree: see WRITE_SEGMENT)."""
        while True:
            pipe = self.redis.pipeline(transaction=True)
            pipe.hget(keys.audio(job_id), str(index))
            pipe.hget(keys.segment_meta(job_id), str(index))
            pipe.hget(keys.fragments(job_id), str(index))
            packed, meta, count = pipe.execute()
            if packed is not None:
                pcm = PackedAudio(as_bytes(packed)).pcm()
                bounds = fragment_bounds({} if meta is None else json.loads(meta), len(pcm))
                cut = [pcm[bounds[n] : bounds[n + 1]] for n in range(first, len(bounds) - 1)]
                return Fragments(first, cut, complete=True)
            count = int(count or 0)
            if count <= first:
                return Fragments(first, [], complete=False)
            found = self.redis.hmget(keys.fragments(job_id), [f"{index}:{n}" for n in range(first, count)])
            if all(value is not None for value in found):
                return Fragments(first, [as_bytes(value) for value in found], complete=False)
            # The segment was written between the two reads, taking its fragments: read it instead.

    def fragment_started_at(self, job_id: str, index: int) -> float | None:
        """Return when a segment being made had its first fragment written (None: none is, or it is written)."""
        value = self.redis.hget(keys.fragments(job_id), f"{index}:at")
        return None if value is None else float(as_bytes(value))

    def has_audio(self, job_id: str) -> bool:
        """Say whether any of the job's audio is still kept (its audio TTL or the memory budget removes it)."""
        return bool(self.redis.exists(keys.audio(job_id)))

    def segment_meta(self, job_id: str) -> dict[int, dict[str, Any]]:
        """Return the metadata of every finished segment by index."""
        raw = self.redis.hgetall(keys.segment_meta(job_id))
        return {int(k): json.loads(v) for k, v in raw.items()}

    def segment_meta_one(self, job_id: str, index: int) -> dict[str, Any]:
        """Return one finished segment's metadata (empty when unknown)."""
        raw = self.redis.hget(keys.segment_meta(job_id), str(index))
        return {} if raw is None else dict(json.loads(raw))

    def segments(self, job_id: str, total: int) -> list[bytes | None]:
        """Return every segment's PCM bytes in order, None where not ready."""
        values = self.redis.hmget(keys.audio(job_id), [str(i) for i in range(total)])
        return [None if v is None else PackedAudio(as_bytes(v)).pcm() for v in values]

    def last_event_id(self, job_id: str) -> str:
        """Return the id of the newest event of the job, or '0-0' when none."""
        newest = self.redis.xrevrange(keys.events(job_id), count=1)
        return as_bytes(newest[0][0]).decode() if newest else "0-0"

    def wait_for_event(self, job_id: str, after: str, timeout_s: float) -> str:
        """Block until an event newer than ``after`` arrives or time runs out; return the newest id seen."""
        if self.waiter is not None:
            return self.waiter.wait(keys.events(job_id), after, timeout_s)
        block_ms = max(1, int(timeout_s * 1000))
        reply = self.redis.xread({keys.events(job_id): after}, block=block_ms)
        if not reply:
            return after
        entries: Any = reply[0][1]  # type: ignore[index]
        return as_bytes(entries[-1][0]).decode()

    def wait_segment(self, job_id: str, index: int, timeout_s: float) -> bytes | None:
        """Return a segment's PCM, waiting up to ``timeout_s`` for it; None if still not ready."""
        deadline = time.monotonic() + timeout_s
        while True:
            last = self.last_event_id(job_id)
            pcm = self.segment(job_id, index)
            if pcm is not None:
                return pcm
            status = as_text(self.redis.hget(keys.job(job_id), "status"))
            remaining = deadline - time.monotonic()
            if remaining <= 0 or status is None or JobStatus(status).terminal:
                # Written between the two reads above (the write that ends a job is its last segment's)?
                return self.segment(job_id, index)
            self.wait_for_event(job_id, last, remaining)
