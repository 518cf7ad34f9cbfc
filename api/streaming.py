"""Follow a job as its audio is made, in order and without busy polling: whole segments (``follow``), or each
segment's fragments as the model makes them (``follow_fragments``).

A follower waits on the job's event stream through the job store's waiter: in the API, one loop per process
blocks in XREAD for every follower at once (cache/events.py), so held streams cost no Redis connection each.
"""

from __future__ import annotations

import base64
import errno
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from api.contract import FragmentEvent, SegmentEvent
from cache.jobstore import JobStore
from cache.records import JobRecord, JobStatus
from core.audio import StreamEncoder
from core.errors import ValidationFailed

KEEPALIVE_S = 15.0
#: An event id as the event stream gives them: ``<index>`` (a segment) or ``<index>.<fragment>``.
EVENT_ID = re.compile(r"([0-9]{1,9})(?:\.([0-9]{1,9}))?")

log = logging.getLogger(__name__)


class CutShort(OSError):
    """Raised when a growing audio stream's job ends without all its audio (canceled, failed, removed).

    The response then ends without its last chunk, so its client sees a download cut short rather than a whole file
    of part of the audio. It is an EPIPE to the server, which closes the connection quietly, as for a client gone.
    """

    def __init__(self, job_id: str, status: str) -> None:
        super().__init__(errno.EPIPE, f"job {job_id} ended {status}: its audio stream was cut short")


@dataclass(frozen=True)
class Position:
    """Where a follower starts: fragment ``fragment`` of segment ``index``."""

    index: int = 0
    fragment: int = 0

    @classmethod
    def after(cls, event_id: str) -> Position:
        """Return the position after an event: ``i.n`` → fragment n+1 of segment i, ``i`` → segment i+1's first;
        raise ValueError for anything else."""
        found = EVENT_ID.fullmatch(event_id)
        if found is None:
            raise ValueError(f"not an event id: {event_id!r}")
        index, fragment = found.groups()
        return cls(int(index) + 1) if fragment is None else cls(int(index), int(fragment) + 1)


@dataclass(frozen=True)
class Ready:
    """Segment ``index`` is ready (of ``total``, None while the job's text stream may add more): whole, or, to a
    fragment follower, every one of its fragments was yielded."""

    index: int
    total: int | None = None


@dataclass(frozen=True)
class Fragment:
    """Fragment ``number`` of segment ``index``: raw 16-bit PCM; ``last`` when it was known, as it was read, to be
    the segment's last (one read while the segment was being made is not, even if no other follows: its Ready
    says so)."""

    index: int
    number: int
    pcm: bytes
    sample_rate: int
    last: bool

    @property
    def event_id(self) -> str:
        """Return the fragment's id in the event stream (``Position.after`` reads it back)."""
        return f"{self.index}.{self.number}"

    @property
    def samples(self) -> int:
        """Return how many samples it holds."""
        return len(self.pcm) // 2


@dataclass(frozen=True)
class Ended:
    """The job reached a terminal status (and every segment before was delivered if it is done)."""

    status: str
    error: str | None


@dataclass(frozen=True)
class Idle:
    """Nothing happened for a while; a stream should send a keep-alive."""


def _ending(record: JobRecord, index: int) -> Ended | None:
    """Return how the follow of a job ends, having delivered the segments before ``index``; None: it goes on."""
    if index >= record.segments_total and not record.text_open:  # an open text stream may still grow
        # Every segment is out; a job that ended otherwise says how (a text stream with nothing to speak fails).
        ended_otherwise = record.status.terminal and record.status is not JobStatus.DONE
        return Ended(record.status.value, record.error) if ended_otherwise else Ended("done", None)
    if record.status.terminal:
        return Ended(record.status.value, record.error)
    return None


def follow(
    store: JobStore, job_id: str, *, start: int = 0, keepalive_s: float = KEEPALIVE_S
) -> Iterator[Ready | Ended | Idle]:
    """Yield segments ``start``, ``start+1``, … in order as they become ready, then how the job ended."""
    index = start
    while True:
        last_event = store.last_event_id(job_id)  # taken before looking, so nothing slips between
        record = store.get(job_id)
        if record is None:
            yield Ended("expired", "the job expired or was removed")
            return
        total = record.segments_total
        known = None if record.text_open else total
        while index < total and store.has_segment(job_id, index):
            yield Ready(index, known)
            index += 1
        ending = _ending(record, index)
        if ending is not None:
            yield ending
            return
        if store.wait_for_event(job_id, last_event, keepalive_s) == last_event:
            yield Idle()


def follow_fragments(
    store: JobStore, job_id: str, *, start: Position = Position(), keepalive_s: float = KEEPALIVE_S
) -> Iterator[Fragment | Ready | Ended | Idle]:
    """Yield fragments from ``start`` on, in order across segments, each once; after a segment's last, its Ready;
    then how the job ended. A segment's fragments join into exactly its stored audio (JobReads.fragments)."""
    index, number = start.index, start.fragment
    while True:
        last_event = store.last_event_id(job_id)  # taken before looking, so nothing slips between
        record = store.get(job_id)
        if record is None:
            yield Ended("expired", "the job expired or was removed")
            return
        total = record.segments_total
        while index < total:
            found = store.fragments(job_id, index, number)
            if found.pcm and record.sample_rate is None:  # its first audio was written after the record was read
                record = store.get(job_id) or record
            for offset, pcm in enumerate(found.pcm, start=1):
                last = found.complete and offset == len(found.pcm)
                yield Fragment(index, number, pcm, record.sample_rate or 0, last)
                number += 1
            if not found.complete:
                break
            yield Ready(index, None if record.text_open else total)
            index, number = index + 1, 0
        ending = _ending(record, index)
        if ending is not None:
            yield ending
            return
        if store.wait_for_event(job_id, last_event, keepalive_s) == last_event:
            yield Idle()


def wait_first_audio(store: JobStore, job_id: str, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for the job's first audio (segment 0's first fragment, or all of it); say whether
    it came."""
    deadline = time.monotonic() + timeout_s
    while True:
        last_event = store.last_event_id(job_id)
        found = store.fragments(job_id, 0)
        if found.pcm:
            return True
        record = store.get(job_id)
        remaining = deadline - time.monotonic()
        if remaining <= 0 or record is None or record.status.terminal:
            return bool(store.fragments(job_id, 0).pcm)  # written between the two reads above?
        store.wait_for_event(job_id, last_event, remaining)


def sse_events(
    store: JobStore,
    job_id: str,
    *,
    start: Position,
    segment_url: str,
    fragments: bool = False,
    keepalive_s: float = KEEPALIVE_S,
) -> Iterator[str]:
    """Render server-sent events: with ``fragments``, one per fragment (id = index.n, its audio inline), and one
    per finished segment (id = index) after its last fragment; then a final status event."""
    yield "retry: 1000\n\n"
    followed: Iterator[Fragment | Ready | Ended | Idle] = (
        follow_fragments(store, job_id, start=start, keepalive_s=keepalive_s)
        if fragments
        else follow(store, job_id, start=start.index, keepalive_s=keepalive_s)
    )
    for event in followed:
        if isinstance(event, Idle):
            yield ": keep-alive\n\n"
        elif isinstance(event, Fragment):
            yield f"id: {event.event_id}\nevent: fragment\ndata: {json.dumps(fragment_data(event))}\n\n"
        elif isinstance(event, Ready):
            meta = store.segment_meta_one(job_id, event.index)
            data = SegmentEvent(index=event.index, duration_s=meta.get("duration_s"),
                                url=segment_url.format(index=event.index), segments_total=event.total)  # fmt: skip
            yield f"id: {event.index}\nevent: segment\ndata: {json.dumps(data.model_dump())}\n\n"
        else:
            final = {"status": event.status, **({"error": event.error} if event.error else {})}
            yield f"event: {event.status}\ndata: {json.dumps(final)}\n\n"


def fragment_fields(fragment: Fragment) -> dict[str, object]:
    """Return what is said of a fragment besides its audio: where it is and how long."""
    rate = fragment.sample_rate
    return {
        "index": fragment.index,
        "fragment": fragment.number,
        "samples": fragment.samples,
        "duration_s": round(fragment.samples / rate, 6) if rate else None,
        "sample_rate": rate or None,
        "last": fragment.last,
    }


def fragment_data(fragment: Fragment) -> dict[str, object]:
    """Return a fragment event's data (``FragmentEvent``): where it is, how long, and its PCM inline."""
    pcm16 = base64.b64encode(fragment.pcm).decode("ascii")
    return FragmentEvent.model_validate({**fragment_fields(fragment), "pcm16": pcm16}).model_dump()


#: Formats a growing stream can carry. FLAC cannot: its header states the length, unknown until the job is done.
STREAMABLE = frozenset({"wav", "pcm", "mp3", "opus", "ogg"})


def cuts_freely(encoder: StreamEncoder) -> bool:
    """Say whether the encoder's bytes depend only on the PCM it is given, not on where it is cut: Vorbis chooses
    its blocks by what each write holds, and linear resampling (Opus at a rate it does not take) by each piece."""
    return encoder.fmt in ("pcm", "wav", "mp3") or (encoder.fmt == "opus" and encoder.rate == encoder.source_rate)


class GrowingFile:
    """One file of ``fmt`` encoded as its audio comes: each fragment at once, or, for an encoder whose bytes depend
    on where its input is cut, each segment whole once its last fragment came; either way the file is the one
    segment-by-segment encoding makes."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.encoder: StreamEncoder | None = None
        self._held: list[bytes] = []  # the segment's fragments so far, for an encoder that takes segments whole

    def fragment(self, fragment: Fragment) -> bytes:
        """Take a fragment; return the bytes that are final so far."""
        if self.encoder is None:
            self.encoder = StreamEncoder(self.fmt, fragment.sample_rate)
        if cuts_freely(self.encoder):
            return self.encoder.write(fragment.pcm)
        self._held.append(fragment.pcm)
        return b""

    def segment_end(self) -> bytes:
        """Take the end of a segment (every fragment of it was given); return the bytes that are final so far."""
        if self.encoder is None or cuts_freely(self.encoder):
            return b""
        whole, self._held = b"".join(self._held), []
        return self.encoder.write(whole)

    def close(self) -> bytes:
        """Finish the file; return its last bytes (none if no audio came)."""
        return b"" if self.encoder is None else self.encoder.close()


def audio_stream(
    store: JobStore,
    job_id: str,
    *,
    fmt: str,
    keepalive_s: float = KEEPALIVE_S,
    gone: Callable[[], bool] = lambda: False,
) -> Iterator[bytes]:
    """Yield the job's audio as it grows: a streaming header, then each fragment in order, encoded as one file
    (``GrowingFile``).

    While nothing comes, every ``keepalive_s`` it asks ``gone`` whether the client has left, and ends if so. A job
    that ends otherwise than done raises CutShort: its audio is not whole.
    """
    growing = GrowingFile(fmt)
    sent = 0
    for event in follow_fragments(store, job_id, keepalive_s=keepalive_s):
        if isinstance(event, Fragment):
            if chunk := growing.fragment(event):
                yield chunk
        elif isinstance(event, Ready):
            sent += 1
            if chunk := growing.segment_end():
                yield chunk
        elif isinstance(event, Idle):
            if gone():
                return  # its slot and this greenlet go back now, not at a stalled job's next segment
            yield b""  # no bytes for the client (an audio stream has no keep-alive), but a turn to renew its slot
        else:
            if event.status != "done":
                log.info("job %s ended %s while its audio was streamed: the stream is cut short", job_id, event.status)
                raise CutShort(job_id, event.status)
            record = store.get(job_id)
            if record is not None and sent < record.segments_total:  # done, its later audio removed meanwhile
                log.info("job %s: its audio after segment %d is gone: the stream is cut short", job_id, sent - 1)
                raise CutShort(job_id, "done, without all its audio")
            yield growing.close()
            return


#: What ``?fragments=`` takes, and what each means.
FLAGS = {"1": True, "true": True, "0": False, "false": False}


def fragments_asked(raw: str | None) -> bool:
    """Return whether ``?fragments=`` asks for fragments (off when absent), or raise 422."""
    if raw is None:
        return False
    if raw not in FLAGS:
        raise ValidationFailed("fragments", "must be 1 or 0 (true or false)")
    return FLAGS[raw]


def resume_position(raw: str | None) -> Position:
    """Return where an event stream resumes after ``Last-Event-ID`` (``i`` or ``i.n``; absent: the start), or raise
    422."""
    if raw is None:
        return Position()
    try:
        return Position.after(raw)
    except ValueError as e:
        raise ValidationFailed("Last-Event-ID", "must be the id of an event: <index> or <index>.<fragment>") from e
