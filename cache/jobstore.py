"""The job store: job records, segment texts and finished segment audio in Redis."""

from __future__ import annotations

import enum
import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.typing import EncodableT, FieldT

from cache import keys, scripts
from cache.events import EventWaiter
from core.audio import PackedAudio
from core.settings import Settings

TERMINAL = frozenset({"done", "failed", "canceled"})

#: A segment taken off a job's pending list is published by its taker at once; past this grace a sweeper
#: publishes it instead (its taker crashed, or lost Redis, between the two steps).
OUTBOX_GRACE_S = 5.0


class WriteResult(enum.IntEnum):
    """What WRITE_SEGMENT did with a finished segment."""

    FINISHED = 2  # written, and it was the job's last
    WRITTEN = 1
    DUPLICATE = 0  # already there: a redelivered or repeated task
    GONE = -1  # no such job (expired, or never was)
    OVER = -2  # the job failed or was canceled meanwhile


@dataclass(frozen=True)
class SegmentWrite:
    """The answer of ``JobStore.write_segment``: the result, and the pending segment it moved to the outbox."""

    result: WriteResult
    next_index: int | None = None


@dataclass(frozen=True)
class JobRequest:
    """What a caller asked for; everything a worker needs besides the texts."""

    model: str
    voice: str
    speed: float
    mode: str
    format: str
    priority: str
    seed: int | None
    cache: bool = True
    #: Whose sentence-cache entries this job may reuse and fills: "" for everyone's, else the owner's caller id.
    cache_scope: str = ""

    def to_json(self) -> str:
        """Serialise to JSON for the job record."""
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> JobRequest:
        """Parse the JSON written by ``to_json``."""
        return cls(**json.loads(raw))


def _text(value: object) -> str | None:
    """Decode a reply of a client made without decode_responses (bytes, or None when absent)."""
    return None if value is None else _raw(value).decode()


def _raw(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError(f"expected bytes from Redis, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class SegmentStart:
    """What a worker knows of a segment's job when it starts on the segment (``JobStore.start_segment``).

    ``state`` is "gone" (no such job), "over" (the job ended), "written" (the segment exists) or
    "go", in which case the segment is held by the worker, the attempt is known and the rest is filled in.
    ``redelivered`` says the delivery's token already held the segment: the same attempt, not a new one.
    ``text`` is this segment's text (None past the job's end). A start that said it knows the job carries a few
    record fields and the metadata of the segments just before this one; otherwise the whole record (with
    ``segment_chars``, every segment's length) and all metadata.
    """

    state: str
    record: dict[str, str] = field(default_factory=dict)
    attempt: int = 0
    redelivered: bool = False
    text: str | None = None
    meta: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def request(self) -> JobRequest | None:
        """Return what the caller asked for (None when the record has no request)."""
        raw = self.record.get("request")
        return None if raw is None else JobRequest.from_json(raw)

    @property
    def chars(self) -> list[int] | None:
        """Return every segment's length in characters, when the whole record was read."""
        raw = self.record.get("segment_chars")
        return None if raw is None else [int(n) for n in raw.split(",")]


def _pairs(flat: list[Any]) -> dict[bytes, bytes]:
    return {_raw(flat[i]): _raw(flat[i + 1]) for i in range(0, len(flat), 2)}


class JobStore:
    """Read and change jobs in Redis; every change of a job is atomic."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        ttl: int,
        audio_ttl: int | None = None,
        codec: str = "flac",
        outbox_grace_s: float = OUTBOX_GRACE_S,
        waiter: EventWaiter | None = None,
    ) -> None:
        self.redis = client
        self.waiter = waiter  # shares one blocked connection among every wait (cache/events.py); None blocks here
        self.ttl = ttl  # a finished job's record
        self.audio_ttl = min(ttl, audio_ttl or ttl)  # a finished job's audio
        self.codec = codec  # how segment audio is kept (core.audio.STORE_CODECS)
        self.outbox_grace_s = outbox_grace_s
        self._write_segment = client.register_script(scripts.WRITE_SEGMENT)
        self._finish = client.register_script(scripts.FINISH)
        self._start_segment = client.register_script(scripts.START_SEGMENT)

    def create(
        self,
        request: JobRequest,
        texts: list[str],
        *,
        job_id: str | None = None,
        cached: int = 0,
        pending: list[int] | None = None,
        publish: Iterable[int] = (),
        fields: dict[str, str] | None = None,
    ) -> str:
        """Write a new queued job with its segment texts; return its id.

        ``publish`` are the segments the caller enqueues next (they wait in the outbox until ``published``
        says so), ``pending`` the ones fed in later as others finish.
        """
        if not texts:
            raise ValueError("a job needs at least one segment")
        job_id = job_id or uuid.uuid4().hex
        now = str((fields or {}).get("created_at") or f"{time.time():.6f}")
        pipe = self.redis.pipeline(transaction=True)
        record: dict[FieldT, EncodableT] = {
            "id": job_id,
            "status": "queued",
            "request": request.to_json(),
            "segments_total": len(texts),
            "segments_done": 0,
            "cached_segments": cached,
            "chars_total": sum(len(t) for t in texts),
            "segment_chars": ",".join(str(len(t)) for t in texts),
            "created_at": now,
            "updated_at": now,
        }
        record.update((fields or {}).items())
        pipe.hset(keys.job(job_id), mapping=record)
        pipe.rpush(keys.texts(job_id), *texts)
        if pending:
            pipe.rpush(keys.pending(job_id), *pending)
        outbox = {keys.segment_member(job_id, i): time.time() + self.outbox_grace_s for i in publish}
        if outbox:
            pipe.zadd(keys.OUTBOX, outbox)
        pipe.zadd(keys.LIVE_JOBS, {job_id: float(now)})
        pipe.execute()
        return job_id

    def published(self, job_id: str, indexes: Iterable[int]) -> None:
        """Take segments out of the outbox once they are on the broker."""
        members = [keys.segment_member(job_id, i) for i in indexes]
        if members:
            self.redis.zrem(keys.OUTBOX, *members)

    def pending(self, job_id: str) -> list[int]:
        """Return the segments still waiting to be enqueued."""
        return [int(_raw(v)) for v in self.redis.lrange(keys.pending(job_id), 0, -1)]

    def live_jobs(self) -> list[str]:
        """Return the ids of jobs not known to be finished, oldest first."""
        return [_raw(v).decode() for v in self.redis.zrange(keys.LIVE_JOBS, 0, -1)]

    def forget_live(self, job_id: str) -> None:
        """Drop a finished (or vanished) job from the live index."""
        self.redis.zrem(keys.LIVE_JOBS, job_id)

    def missing_segments(self, job_id: str, total: int) -> list[int]:
        """Return the indexes of segments not written yet."""
        done = {int(_raw(k)) for k in self.redis.hkeys(keys.audio(job_id))}
        return [i for i in range(total) if i not in done]

    def unstarted_or_lost(self, job_ids: Iterable[str]) -> dict[str, list[int]]:
        """Return, for each live job, its unwritten segments that are not pending (in one round trip)."""
        job_ids = list(job_ids)
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), ["status", "segments_total"])
            pipe.hkeys(keys.audio(job_id))
            pipe.lrange(keys.pending(job_id), 0, -1)
        replies = pipe.execute()
        found = {}
        for n, job_id in enumerate(job_ids):
            (status, total), written, pending = replies[3 * n : 3 * n + 3]
            if status is None or _raw(status).decode() in TERMINAL:
                continue
            skip = {int(_raw(i)) for i in written} | {int(_raw(i)) for i in pending}
            found[job_id] = [i for i in range(int(_raw(total))) if i not in skip]
        return found

    def touch(self, job_id: str) -> None:
        """Mark the job as looked after now (the reconciler's last visit)."""
        self.redis.hset(keys.job(job_id), "updated_at", f"{time.time():.6f}")

    def get(self, job_id: str) -> dict[str, str] | None:
        """Return the job's record as strings, or None when there is no such job."""
        raw = self.redis.hgetall(keys.job(job_id))
        if not raw:
            return None
        return {_raw(k).decode(): _raw(v).decode() for k, v in raw.items()}

    def texts(self, job_id: str) -> list[str]:
        """Return every segment text of the job, in order."""
        return [_raw(t).decode() for t in self.redis.lrange(keys.texts(job_id), 0, -1)]

    def has_segment(self, job_id: str, index: int) -> bool:
        """Say whether a segment's audio is already written."""
        return bool(self.redis.hexists(keys.audio(job_id), str(index)))

    def start_segment(
        self, job_id: str, index: int, *, worker: str = "", token: str | None = None, known: bool = False
    ) -> SegmentStart:
        """Read what making one segment needs, hold it for ``worker`` and count the attempt (see START_SEGMENT).

        ``token`` names the delivery (a task id and its retry count): a redelivery with the same token is
        the same attempt. Without one, every call is a new attempt. ``known`` says the caller already has the
        job's timeline, so only the metadata of the segments just before this one is read.
        """
        reply = self._start_segment(
            keys=[keys.job(job_id), keys.audio(job_id), keys.attempts(job_id), keys.texts(job_id),
                  keys.segment_meta(job_id), keys.claims(job_id), keys.held(worker), keys.HOLDERS],
            args=[str(index), f"{time.time():.6f}", token or uuid.uuid4().hex, keys.segment_member(job_id, index),
                  worker, "1" if known else "0", *sorted(TERMINAL)],
        )  # fmt: skip
        state = ("gone", "over", "written", "go")[int(reply[0])]
        if state != "go":
            return SegmentStart(state)
        _, record, attempt, text, meta, redelivered = reply
        return SegmentStart(
            state,
            record={k.decode(): v.decode() for k, v in _pairs(record).items()},
            attempt=int(attempt),
            redelivered=bool(int(redelivered)),
            text=_text(text) if text else None,
            meta={int(k): json.loads(v) for k, v in _pairs(meta).items()},
        )

    def attempts(self, job_id: str, index: int) -> int:
        """Return how many synthesis attempts a segment has had."""
        return int(self.redis.hget(keys.attempts(job_id), str(index)) or 0)

    def pack(self, audio: bytes | PackedAudio, sample_rate: int) -> PackedAudio:
        """Return segment audio as the store keeps it: raw PCM is encoded with the store's codec."""
        return audio if isinstance(audio, PackedAudio) else PackedAudio.pack(audio, sample_rate, self.codec)

    def _write_args(
        self,
        job_id: str,
        index: int,
        audio: bytes | PackedAudio,
        rate: int,
        meta: dict[str, Any],
        *,
        worker: str,
        advance: bool,
    ) -> tuple[list[str], list[EncodableT]]:
        now = time.time()
        script_keys = [
            *keys.all_job_keys(job_id), keys.held(worker), keys.OUTBOX, keys.LIVE_JOBS, keys.DUE, keys.AUDIO_KEPT,
        ]  # fmt: skip
        args: list[EncodableT] = [
            index, self.pack(audio, rate).data, json.dumps(meta), f"{now:.6f}", self.ttl, rate,
            keys.segment_member(job_id, index), job_id, f"{now + self.outbox_grace_s:.6f}", "1" if advance else "0",
            self.audio_ttl, f"{now + self.audio_ttl:.3f}",
        ]  # fmt: skip
        return script_keys, args

    def write_segments(
        self, job_id: str, segments: Mapping[int, tuple[bytes | PackedAudio, int, dict[str, Any]]]
    ) -> list[WriteResult]:
        """Store several finished segments (index → audio, rate, meta) in one round trip, advancing nothing."""
        pipe = self.redis.pipeline(transaction=False)
        for index, (audio, rate, meta) in sorted(segments.items()):
            script_keys, args = self._write_args(job_id, index, audio, rate, meta, worker="", advance=False)
            self._write_segment(keys=script_keys, args=args, client=pipe)
        return [WriteResult(int(reply[0])) for reply in pipe.execute()]

    def write_segment(
        self,
        job_id: str,
        index: int,
        audio: bytes | PackedAudio,
        *,
        sample_rate: int,
        meta: dict[str, Any],
        worker: str = "",
        advance: bool = False,
    ) -> SegmentWrite:
        """Store a finished segment once (raw PCM, or audio already packed), releasing ``worker``'s hold; with
        ``advance``, move the next pending one to the outbox (the caller publishes it, then calls ``published``).

        A store at its memory limit raises ``redis.OutOfMemoryError`` having changed nothing.
        """
        script_keys, args = self._write_args(job_id, index, audio, sample_rate, meta, worker=worker, advance=advance)
        result, next_index = self._write_segment(keys=script_keys, args=args)
        return SegmentWrite(WriteResult(int(result)), None if int(next_index) < 0 else int(next_index))

    def hold(self, worker: str, job_id: str, index: int) -> None:
        """Record that a segment was delivered to ``worker`` (START_SEGMENT records it again)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.sadd(keys.held(worker), keys.segment_member(job_id, index))
        pipe.sadd(keys.HOLDERS, worker)
        pipe.execute()

    def release(self, worker: str, job_id: str, index: int) -> None:
        """Say that ``worker`` stopped working on a segment without writing it (its task failed or retries)."""
        self.redis.srem(keys.held(worker), keys.segment_member(job_id, index))

    def fail(self, job_id: str, reason: str) -> bool:
        """Mark the job failed with a reason unless it already ended; say whether it changed."""
        return self._end(job_id, "failed", reason)

    def cancel(self, job_id: str) -> bool:
        """Mark the job canceled unless it already ended; say whether it changed."""
        return self._end(job_id, "canceled", "canceled by the client")

    def _end(self, job_id: str, status: str, reason: str) -> bool:
        now = time.time()
        result = int(
            self._finish(
                keys=[*keys.all_job_keys(job_id), keys.AUDIO_KEPT],
                args=[status, reason, f"{now:.6f}", self.ttl, self.audio_ttl, f"{now + self.audio_ttl:.3f}", job_id],
            )
        )
        if result != 0:
            self.forget_live(job_id)
        return result == 1

    def segment(self, job_id: str, index: int) -> bytes | None:
        """Return a finished segment's PCM bytes, or None when not ready (or no longer kept)."""
        packed = self.packed_segment(job_id, index)
        return None if packed is None else packed.pcm()

    def packed_segment(self, job_id: str, index: int) -> PackedAudio | None:
        """Return a finished segment as the store keeps it (to copy it on without decoding it)."""
        value = self.redis.hget(keys.audio(job_id), str(index))
        return None if value is None else PackedAudio(_raw(value))

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
        return [None if v is None else PackedAudio(_raw(v)).pcm() for v in values]

    def last_event_id(self, job_id: str) -> str:
        """Return the id of the newest event of the job, or '0-0' when none."""
        newest = self.redis.xrevrange(keys.events(job_id), count=1)
        return _raw(newest[0][0]).decode() if newest else "0-0"

    def wait_for_event(self, job_id: str, after: str, timeout_s: float) -> str:
        """Block until an event newer than ``after`` arrives or time runs out; return the newest id seen."""
        if self.waiter is not None:
            return self.waiter.wait(keys.events(job_id), after, timeout_s)
        block_ms = max(1, int(timeout_s * 1000))
        reply = self.redis.xread({keys.events(job_id): after}, block=block_ms)
        if not reply:
            return after
        entries: Any = reply[0][1]  # type: ignore[index]
        return _raw(entries[-1][0]).decode()

    def wait_segment(self, job_id: str, index: int, timeout_s: float) -> bytes | None:
        """Return a segment's PCM, waiting up to ``timeout_s`` for it; None if still not ready."""
        deadline = time.monotonic() + timeout_s
        while True:
            last = self.last_event_id(job_id)
            pcm = self.segment(job_id, index)
            if pcm is not None:
                return pcm
            status = self.redis.hget(keys.job(job_id), "status")
            remaining = deadline - time.monotonic()
            if remaining <= 0 or status is None or _text(status) in TERMINAL:
                # Written between the two reads above (the write that ends a job is its last segment's)?
                return self.segment(job_id, index)
            self.wait_for_event(job_id, last, remaining)


def store_of(client: redis.Redis, settings: Settings, *, waiter: EventWaiter | None = None) -> JobStore:
    """Return the job store on ``client`` with the settings' retention and audio codec."""
    return JobStore(
        client, ttl=settings.job_ttl_s, audio_ttl=settings.audio_ttl_s, codec=settings.audio_store_codec, waiter=waiter
    )
