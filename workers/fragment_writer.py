"""Write a segment's fragments into the job store the moment each is made, and join them into the segment after.

A fragment is written once and in order (cache/scripts.py WRITE_FRAGMENT): an attempt that makes a segment again,
its worker having died mid-segment, finds the fragments its predecessor wrote, skips them and writes on from
there, so its listener hears no repeat and no hole. The segment written at the end is then what was heard: the
fragments already in the store, followed by this attempt's later ones. A fragment that cannot be written (the store
at its limit, Redis away) is not retried: the ones after it wait in the segment, written whole at the end.

A segment's last fragment (its only one too: an engine that cannot stream, a short segment, fragments off) is not
written on its own: the segment's write follows at once and holds it, and a reader learns from it that the
fragment is the segment's last.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from cache.jobstore import JobStore
from cache.records import FragmentResult
from core.audio import to_pcm16
from workers.engines.base import Piece

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Joined:
    """A segment's audio as its fragments make it: 16-bit PCM, each fragment's samples, when the first was heard."""

    pcm: bytes
    lengths: list[int]
    first_at: float | None


class FragmentWriter:
    """Told one segment's fragments as its engine makes them; writes each into the store at once."""

    def __init__(self, store: JobStore, job_id: str, index: int, *, has_room: Callable[[], bool] | None = None) -> None:
        self.store = store
        self.job_id = job_id
        self.index = index
        self.has_room = has_room
        self._parts: list[bytes] = []  # this attempt's fragments, as 16-bit PCM
        self._writing = True  # until one cannot be written: none after it is
        self._found_older = False  # an earlier attempt wrote some of them
        self._first_at: float | None = None

    def __call__(self, piece: Piece, rate: int) -> None:
        """Write one fragment (told in order; a retried engine call tells them again from the first)."""
        if piece.number == 0:
            self._parts = []
        pcm = to_pcm16(piece.samples)
        self._parts.append(pcm)
        if not self._writing or piece.last:
            return
        if self.has_room is not None and not self.has_room():
            self._writing = False  # the segment's own write waits for room; fragments would only add to it
            return
        try:
            result = self.store.write_fragment(self.job_id, self.index, piece.number, pcm, sample_rate=rate)
        except redis.RedisError as e:
            log.info("job %s: fragment %d of segment %d not written (%s): the rest comes with the segment",
                     self.job_id, piece.number, self.index, e)  # fmt: skip
            self._writing = False
            return
        if result is FragmentResult.WRITTEN and piece.number == 0:
            self._first_at = time.time()
        self._found_older |= result is FragmentResult.DUPLICATE
        self._writing = result.written_or_there

    def joined(self) -> Joined:
        """Return the segment's audio: its fragments in the store (an earlier attempt's too), then this attempt's."""
        own = list(self._parts)
        if not self._found_older:
            return Joined(b"".join(own), [len(p) // 2 for p in own], self._first_at)
        stored = self.store.fragments(self.job_id, self.index)
        older = stored.pcm if not stored.complete else []
        first_at = self.store.fragment_started_at(self.job_id, self.index)
        parts = [*older, *own[len(older) :]]
        return Joined(b"".join(parts), [len(p) // 2 for p in parts], first_at)
