"""Follow a job as its segments finish: in order, without busy polling.

A follower waits on the job's event stream through the job store's waiter: in the API, one loop per process
blocks in XREAD for every follower at once (cache/events.py), so held streams cost no Redis connection each.
"""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cache.jobstore import JobStore
from cache.records import JobStatus
from core.audio import StreamEncoder

KEEPALIVE_S = 15.0

log = logging.getLogger(__name__)


class CutShort(OSError):
    """Raised when a growing audio stream's job ends without all its audio (canceled, failed, removed).

    The response then ends without its last chunk, so its client sees a download cut short rather than a whole file
    of part of the audio. It is an EPIPE to the server, which closes the connection quietly, as for a client gone.
    """

    def __init__(self, job_id: str, status: str) -> None:
        super().__init__(errno.EPIPE, f"job {job_id} ended {status}: its audio stream was cut short")


@dataclass(frozen=True)
class Ready:
    """Segment ``index`` is ready (of ``total``, None while the job's text stream may add more)."""

    index: int
    total: int | None = None


@dataclass(frozen=True)
class Ended:
    """The job reached a terminal status (and every segment before was delivered if it is done)."""

    status: str
    error: str | None


@dataclass(frozen=True)
class Idle:
    """Nothing happened for a while; a stream should send a keep-alive."""


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
        if index >= total and not record.text_open:  # an open text stream may still grow
            # Every segment is out; a job that ended otherwise says how (a text stream with nothing to speak fails).
            ended_otherwise = record.status.terminal and record.status is not JobStatus.DONE
            yield Ended(record.status.value, record.error) if ended_otherwise else Ended("done", None)
            return
        if record.status.terminal:
            yield Ended(record.status.value, record.error)
            return
        if store.wait_for_event(job_id, last_event, keepalive_s) == last_event:
            yield Idle()


def sse_events(
    store: JobStore, job_id: str, *, start: int, segment_url: str, keepalive_s: float = KEEPALIVE_S
) -> Iterator[str]:
    """Render server-sent events: one per finished segment (id = index), then a final status event."""
    yield "retry: 1000\n\n"
    for event in follow(store, job_id, start=start, keepalive_s=keepalive_s):
        if isinstance(event, Idle):
            yield ": keep-alive\n\n"
        elif isinstance(event, Ready):
            meta = store.segment_meta_one(job_id, event.index)
            data = {
                "index": event.index,
                "duration_s": meta.get("duration_s"),
                "url": segment_url.format(index=event.index),
                # null while a text stream is open: more segments may come
                "segments_total": event.total,
            }
            yield f"id: {event.index}\nevent: segment\ndata: {json.dumps(data)}\n\n"
        else:
            final = {"status": event.status, **({"error": event.error} if event.error else {})}
            yield f"event: {event.status}\ndata: {json.dumps(final)}\n\n"


#: Formats a growing stream can carry. FLAC cannot: its header states the length, unknown until the job is done.
STREAMABLE = frozenset({"wav", "pcm", "mp3", "opus", "ogg"})


def audio_stream(
    store: JobStore,
    job_id: str,
    *,
    fmt: str,
    keepalive_s: float = KEEPALIVE_S,
    gone: Callable[[], bool] = lambda: False,
) -> Iterator[bytes]:
    """Yield the job's audio as it grows: a streaming header, then each segment in order, encoded as one file.

    While no segment comes, every ``keepalive_s`` it asks ``gone`` whether the client has left, and ends if so. A job
    that ends otherwise than done raises CutShort: its audio is not whole.
    """
    encoder: StreamEncoder | None = None
    sent = 0
    for event in follow(store, job_id, keepalive_s=keepalive_s):
        if isinstance(event, Ended):
            if event.status != "done":
                log.info("job %s ended %s while its audio was streamed: the stream is cut short", job_id, event.status)
                raise CutShort(job_id, event.status)
            record = store.get(job_id)
            if record is not None and sent < record.segments_total:  # done, its later audio removed meanwhile
                log.info("job %s: its audio after segment %d is gone: the stream is cut short", job_id, sent - 1)
                raise CutShort(job_id, "done, without all its audio")
            if encoder is not None:
                yield encoder.close()
            return
        if isinstance(event, Idle):
            if gone():
                return  # its slot and this greenlet go back now, not at a stalled job's next segment
            yield b""  # no bytes for the client (an audio stream has no keep-alive), but a turn to renew its slot
            continue
        pcm = store.segment(job_id, event.index)
        if pcm is None:  # its audio removed meanwhile (its TTL, or the memory budget): the file cannot be whole
            log.info("job %s: segment %d's audio is gone: the stream is cut short", job_id, event.index)
            raise CutShort(job_id, "without its audio")
        if encoder is None:
            record = store.get(job_id)
            encoder = StreamEncoder(fmt, (record.sample_rate or 0) if record else 0)
        sent += 1
        yield encoder.write(pcm)
