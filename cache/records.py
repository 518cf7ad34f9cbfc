"""Typed records of what the job store keeps and what its scripts answer: nothing untyped leaves Redis."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.policy import Lane


class JobStatus(enum.StrEnum):
    """Where a job is in its life; the Lua scripts, the API and the OpenAPI document spell it from here."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def terminal(self) -> bool:
        """Say whether the job has ended (nothing changes it any more)."""
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELED})


@dataclass(frozen=True)
class JobRequest:
    """What a caller asked for; everything a worker needs besides the texts."""

    model: str
    voice: str
    speed: float
    mode: str
    format: str
    priority: Lane
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


def _float(value: str | None) -> float | None:
    return None if value in (None, "") else float(value)


@dataclass(frozen=True)
class JobRecord:
    """One job's record as the store keeps it (a Redis hash), parsed once into typed fields.

    A partial read (a worker's start on a job it knows) fills only some fields; the others keep their defaults.
    """

    id: str
    status: JobStatus
    request: JobRequest
    segments_total: int = 0
    segments_done: int = 0
    cached_segments: int = 0
    chars_total: int = 0
    #: Every segment's length in characters (None when the read did not include them).
    segment_chars: tuple[int, ...] | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    sample_rate: int | None = None
    error: str | None = None
    #: The caller id of the key that submitted it ("" with keys off): the only caller its routes answer.
    owner: str = ""
    #: The model's pace at acceptance (seconds of audio per character), which its deadlines were set from.
    seconds_per_char: float | None = None
    first_due_at: float | None = None
    start_estimate_s: float | None = None
    audio_expires_at: float | None = None
    audio_removed_at: float | None = None
    #: Why the audio went before its time ("memory": the store's budget trimmed it).
    audio_removed_for: str | None = None
    #: A text stream's state (None: the job took its whole text at once): open for more pieces, or closed.
    text_open: bool | None = None
    #: The next piece a text stream expects, and why it closed ("final", or the idle time it waited).
    text_next_seq: int = 0
    text_end_reason: str | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> JobRecord | None:
        """Parse a record's hash, or return None when it is no job: empty, or a stray write left only a few fields
        (the memory budget's mark on a record that expired meanwhile, say)."""
        return cls.from_hash(raw) if "id" in raw and "request" in raw else None

    @classmethod
    def from_hash(cls, raw: Mapping[str, str]) -> JobRecord:
        """Parse a record's hash fields (decoded); unknown fields are ignored, missing ones take defaults."""
        chars = raw.get("segment_chars")
        return cls(
            id=raw["id"],
            status=JobStatus(raw.get("status", JobStatus.QUEUED)),
            request=JobRequest.from_json(raw["request"]),
            segments_total=int(raw.get("segments_total") or 0),
            segments_done=int(raw.get("segments_done") or 0),
            cached_segments=int(raw.get("cached_segments") or 0),
            chars_total=int(raw.get("chars_total") or 0),
            segment_chars=None if chars is None else tuple(int(n) for n in chars.split(",") if n),
            created_at=float(raw.get("created_at") or 0.0),
            updated_at=float(raw.get("updated_at") or 0.0),
            started_at=_float(raw.get("started_at")),
            finished_at=_float(raw.get("finished_at")),
            sample_rate=None if raw.get("sample_rate") is None else int(raw["sample_rate"]),
            error=raw.get("error"),
            owner=raw.get("owner", ""),
            seconds_per_char=_float(raw.get("seconds_per_char")),
            first_due_at=_float(raw.get("first_due_at")),
            start_estimate_s=_float(raw.get("start_estimate_s")),
            audio_expires_at=_float(raw.get("audio_expires_at")),
            audio_removed_at=_float(raw.get("audio_removed_at")),
            audio_removed_for=raw.get("audio_removed_for"),
            text_open=None if raw.get("text_open") is None else raw["text_open"] == "1",
            text_next_seq=int(raw.get("text_next_seq") or 0),
            text_end_reason=raw.get("text_end_reason"),
        )


class StartState(enum.IntEnum):
    """What START_SEGMENT found (its first reply element)."""

    GONE = 0  # no such job (expired, or never was)
    OVER = 1  # the job ended
    WRITTEN = 2  # the segment exists already
    GO = 3  # held by this worker: make it


class WriteResult(enum.IntEnum):
    """What WRITE_SEGMENT did with a finished segment."""

    FINISHED = 2  # written, and it was the job's last
    WRITTEN = 1
    DUPLICATE = 0  # already there: a redelivered or repeated task
    GONE = -1  # no such job (expired, or never was)
    OVER = -2  # the job failed or was canceled meanwhile


class FragmentResult(enum.IntEnum):
    """What WRITE_FRAGMENT did with one fragment of a segment being made."""

    WRITTEN = 1
    DUPLICATE = 0  # already there: an earlier attempt at the segment wrote it
    SEGMENT_WRITTEN = 3  # the whole segment is written: its fragments are in it
    OUT_OF_ORDER = 4  # an earlier fragment is missing (not written for want of room): none after it is written
    GONE = -1  # no such job (expired, or never was)
    OVER = -2  # the job ended meanwhile

    @property
    def written_or_there(self) -> bool:
        """Say whether the listener has the fragment (written now, or before)."""
        return self in (FragmentResult.WRITTEN, FragmentResult.DUPLICATE)


class PieceResult(enum.IntEnum):
    """What TAKE_PIECE did with one piece of a text stream."""

    TAKEN = 1
    DUPLICATE = 2  # the same seq and text again: a retry, answered as before
    CONFLICT = 3  # the same seq with other text
    AFTER_FINAL = 4  # past the final piece, or a second final
    CLOSED = 5  # the stream ended (its final piece, or idle)
    OVER = 6  # the job failed or was canceled
    TOO_LONG = 7  # the stream would carry more characters than one job may
    TOO_FAR = 8  # the seq is too far ahead of the next one expected
    NOT_A_STREAM = 9
    NO_ROOM = 10  # text the job store has no room to reserve audio for now: not kept, so the same piece may come again
    GONE = 0


class EndResult(enum.IntEnum):
    """What FINISH did when asked to end a job (fail or cancel)."""

    ENDED = 1
    ALREADY_OVER = 0
    GONE = -1


@dataclass(frozen=True)
class SegmentWrite:
    """The answer of ``JobStore.write_segment``: the result, and the pending segment it moved to the outbox."""

    result: WriteResult
    next_index: int | None = None


@dataclass(frozen=True)
class SegmentStart:
    """What a worker knows of a segment's job when it starts on the segment (``JobStore.start_segment``).

    Only when ``state`` is GO is the segment held by the worker, the attempt known and the rest filled in.
    ``redelivered`` says the delivery's token already held the segment: the same attempt, not a new one.
    ``failed`` counts the segment's attempts that failed (the engine raised, or the worker died holding it):
    only failures count against the attempt cap, never redeliveries, duplicates or Redis faults.
    ``text`` is this segment's text (None past the job's end). A start that said it knows the job carries a
    partial record and the metadata of the segments just before this one; otherwise the whole record (with
    ``segment_chars``) and all metadata.
    """

    state: StartState
    record: JobRecord | None = None
    attempt: int = 0
    redelivered: bool = False
    failed: int = 0
    text: str | None = None
    meta: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def request(self) -> JobRequest | None:
        """Return what the caller asked for (None unless the start found the job)."""
        return None if self.record is None else self.record.request

    @property
    def chars(self) -> list[int] | None:
        """Return every segment's length in characters, when the whole record was read."""
        chars = None if self.record is None else self.record.segment_chars
        return None if chars is None else list(chars)
