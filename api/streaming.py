"""Follow a job as its segments finish: in order, without busy polling (XREAD BLOCK on its event stream)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from cache.jobstore import TERMINAL, JobStore
from core.audio import OpusStream, encode, mp3_frames

KEEPALIVE_S = 15.0


@dataclass(frozen=True)
class Ready:
    """Segment ``index`` is ready."""

    index: int


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
        total = int(record["segments_total"])
        while index < total and store.has_segment(job_id, index):
            yield Ready(index)
            index += 1
        if index >= total:
            yield Ended("done", None)
            return
        if record["status"] in TERMINAL:
            yield Ended(record["status"], record.get("error"))
            return
        if store.wait_for_event(job_id, last_event, keepalive_s) == last_event:
            yield Idle()


def sse_events(store: JobStore, job_id: str, *, start: int, segment_url: str) -> Iterator[str]:
    """Render server-sent events: one per finished segment (id = index), then a final status event."""
    yield "retry: 1000\n\n"
    for event in follow(store, job_id, start=start):
        if isinstance(event, Idle):
            yield ": keep-alive\n\n"
        elif isinstance(event, Ready):
            meta = store.segment_meta_one(job_id, event.index)
            data = {
                "index": event.index,
                "duration_s": meta.get("duration_s"),
                "url": segment_url.format(index=event.index),
            }
            yield f"id: {event.index}\nevent: segment\ndata: {json.dumps(data)}\n\n"
        else:
            final = {"status": event.status, **({"error": event.error} if event.error else {})}
            yield f"event: {event.status}\ndata: {json.dumps(final)}\n\n"


def wav_stream_header(sample_rate: int) -> bytes:
    """Return a 16-bit mono WAV header with unknown (maximal) sizes, for a stream still growing."""
    unknown = 0xFFFFFFFF
    return (
        b"RIFF"
        + struct.pack("<I", unknown)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", unknown)
    )


#: Formats a growing stream can carry. Ogg Vorbis and FLAC cannot grow piece by piece.
STREAMABLE = frozenset({"wav", "pcm", "mp3", "opus"})


def audio_stream(store: JobStore, job_id: str, *, fmt: str) -> Iterator[bytes]:
    """Yield the job's audio as it grows: a streaming header, then each segment in order."""
    opus: OpusStream | None = None
    rate = 0
    for event in follow(store, job_id):
        if isinstance(event, Ended):
            if opus is not None:
                yield opus.close()
            return
        if isinstance(event, Idle):
            continue  # keep-alives carry nothing in audio
        pcm = store.segment(job_id, event.index)
        if pcm is None:
            return
        if not rate:
            record = store.get(job_id)
            rate = int(record["sample_rate"]) if record else 0
            if fmt == "wav":
                yield wav_stream_header(rate)
            elif fmt == "opus":
                opus = OpusStream(rate)
        if opus is not None:
            yield opus.write(pcm)
        elif fmt == "mp3":
            yield mp3_frames(encode(pcm, rate, fmt))
        else:
            yield pcm
