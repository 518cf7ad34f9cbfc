"""A finished job's whole audio, encoded as it is sent: the API holds a segment at a time, never the file."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cache.jobstore import JobStore
from core.audio import StreamEncoder

log = logging.getLogger(__name__)

#: Whole files up to this size (and only jobs whose audio is this small) go to the cross-job file cache.
FILE_CACHE_MAX_BYTES = 8 * 1024 * 1024
#: Formats whose header states the length: the samples are counted (one segment at a time) before sending.
NEEDS_LENGTH = frozenset({"wav", "flac"})


@dataclass(frozen=True)
class Download:
    """A finished job's file as it will be sent: its chunks, its length when known, and its audio's size."""

    chunks: Encoded
    length: int | None
    pcm_bytes: int


def count_samples(store: JobStore, job_id: str, total: int) -> int | None:
    """Return the job's length in samples, reading one segment at a time (FLAC's header says, without decoding);
    None if one is missing."""
    samples = 0
    for index in range(total):
        packed = store.packed_segment(job_id, index)
        if packed is None:
            return None
        samples += packed.samples()
    return samples


class Encoded:
    """The job's segments through the encoder, one read and encoded at a time; ``complete`` once all went out."""

    def __init__(self, store: JobStore, job_id: str, encoder: StreamEncoder, total: int) -> None:
        self.store, self.job_id, self.encoder, self.total = store, job_id, encoder, total
        self.complete = False

    def __iter__(self) -> Iterator[bytes]:
        for index in range(self.total):
            pcm = self.store.segment(self.job_id, index)
            if pcm is None:  # its audio went (expired or trimmed) mid-download: the file ends short
                log.warning("job %s: segment %d vanished during a download; the file ends early", self.job_id, index)
                return
            yield self.encoder.write(pcm)
        yield self.encoder.close()
        self.complete = True


def download(store: JobStore, job_id: str, *, fmt: str, sample_rate: int, total: int) -> Download | None:
    """Prepare the job's file in ``fmt``; None if a segment is missing."""
    samples = count_samples(store, job_id, total) if fmt in NEEDS_LENGTH else None
    if fmt in NEEDS_LENGTH and samples is None:
        return None
    if samples is None:
        if store.missing_segments(job_id, total):
            return None
        meta = store.segment_meta(job_id)
        pcm_bytes = round(sum(float(m.get("duration_s", 0.0)) for m in meta.values()) * sample_rate) * 2
    else:
        pcm_bytes = samples * 2
    encoder = StreamEncoder(fmt, sample_rate, total_samples=samples)
    length = 44 + pcm_bytes if fmt == "wav" else None
    return Download(Encoded(store, job_id, encoder, total), length, pcm_bytes)


def kept(chunks: Encoded, keep: Callable[[bytes], None], *, limit: int = FILE_CACHE_MAX_BYTES) -> Iterator[bytes]:
    """Yield the chunks; once the whole file went out, hand it to ``keep`` unless it grew past ``limit`` (a file
    cut short by a segment that vanished is never kept)."""
    parts: list[bytes] | None = []
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if parts is not None and size <= limit:
            parts.append(chunk)
        else:
            parts = None
        yield chunk
    if parts is not None and chunks.complete:
        keep(b"".join(parts))
