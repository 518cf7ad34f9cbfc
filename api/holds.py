"""Held requests (streams, long-polls, downloads): a slot each, so that no caller and no flood holds them all."""

from __future__ import annotations

import logging
import math
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import redis
from flask import Response, has_request_context, request, stream_with_context

from cache.nodes import close_log, open_log
from cache.streams import CallerStreams
from core.errors import ServiceUnavailable, TooManyRequests
from core.metrics import ADMISSION_REJECTIONS

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A held response goes out in pieces of at most this many bytes, each of which must be taken by the client within
#: ``write_timeout_s`` (the socket's timeout): a client that takes less than that is dropped, and its slot freed.
WRITE_PIECE_BYTES = 64 * 1024


class Hold:
    """One open stream's slot: renewed as the stream goes on, given back once (its close, or its end)."""

    def __init__(self, holds: StreamHolds, caller: str, slot: str) -> None:
        self._holds = holds
        self.caller = caller
        self.slot = slot
        self._renewed = time.monotonic()
        self._released = False

    def confirm(self) -> None:
        """Return once what the stream read for its next chunk is on a replica (api/served.py)."""
        self._holds.confirm()

    @property
    def write_timeout_s(self) -> float:
        """How long each write of the held response may take (its holds' setting)."""
        return self._holds.write_timeout_s

    def keep(self) -> None:
        """Renew the slot if a third of its ttl has passed (a stream calls this at every chunk)."""
        now = time.monotonic()
        if self._released or now - self._renewed < self._holds.ttl_s / 3:
            return
        self._renewed = now
        try:
            self._holds.streams.renew(self.caller, self.slot)
        except redis.RedisError as e:  # the stream goes on; at worst its slot lapses early
            log.warning("could not renew stream slot of %s: %s", self.caller, e)

    def release(self) -> None:
        """Give the slot back (again is a no-op)."""
        if self._released:
            return
        self._released = True
        self._holds.closed()
        try:
            self._holds.streams.close(self.caller, self.slot)
        except redis.RedisError as e:  # it lapses on its own
            log.warning("could not give back stream slot of %s: %s", self.caller, e)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class StreamHolds:
    """Admit held requests: at most ``per_caller`` per caller across processes, ``per_process`` in this one."""

    def __init__(
        self,
        streams: CallerStreams,
        *,
        per_caller: int,
        per_process: int,
        ttl_s: float,
        write_timeout_s: float = 30.0,
        keepalive_s: float = 15.0,
        confirm: Callable[[], None] | None = None,
    ) -> None:
        self.streams = streams
        self.confirm = confirm or (lambda: None)  # before a chunk goes out: what it read is on a replica
        # What a caller at its limit is told to wait: a stream that ends frees its slot at once, but one whose client
        # left is noticed at a write that fails, which an event stream's keep-alives reach by the second of them
        # (a growing audio stream looks at its client at each). A long-poll holds its slot for its wait.
        self.retry_after_s = max(1, math.ceil(2 * keepalive_s))
        self.per_caller = per_caller
        self.per_process = per_process
        self.ttl_s = ttl_s
        self.write_timeout_s = write_timeout_s
        self._lock = threading.Lock()
        self._open = 0

    @property
    def open_here(self) -> int:
        """Return how many holds this process has open."""
        return self._open

    def hold(self, caller: str) -> Hold:
        """Take a slot for ``caller``, or raise 503 (this process is full) or 429 (the caller is)."""
        with self._lock:
            if self._open >= self.per_process:
                full = True
            else:
                full = False
                self._open += 1
        if full:
            ADMISSION_REJECTIONS.labels("streams_process").inc()
            raise ServiceUnavailable(
                f"this API process holds its limit of {self.per_process} open streams (max_streams_per_process); "
                "retry shortly",
                retry_after=1,
                limit="max_streams_per_process",
                max=self.per_process,
            )
        try:
            slot = self.streams.open(caller, limit=self.per_caller)
        except BaseException:
            self.closed()
            raise
        if slot is None:
            self.closed()
            ADMISSION_REJECTIONS.labels("streams_caller").inc()
            raise TooManyRequests(
                f"you hold your limit of {self.per_caller} open streams and long-polls (max_streams_per_caller); "
                f"close one, or retry in {self.retry_after_s} s (a stream whose client left frees its slot within "
                "two keep-alives)",
                retry_after=self.retry_after_s,
                limit="max_streams_per_caller",
                max=self.per_caller,
            )
        return Hold(self, caller, slot)

    def closed(self) -> None:
        """Count one of this process's holds as given back."""
        with self._lock:
            self._open -= 1


def held(hold: Hold, chunks: Iterable[T]) -> Iterator[T]:
    """Yield the chunks, renewing the hold at each; give it back when they end or the client leaves.

    Every chunk renews: each was taken by the client before the server asked for the next (a write that stalls
    ends the response at the socket's timeout), and an empty one is a growing stream's idle turn, taken after it
    looked that its client is still connected. A chunk over ``WRITE_PIECE_BYTES`` goes out in pieces of that size.
    Under a Sentinel group a chunk goes out only once what was read to make it is confirmed (api/served.py).
    """
    open_log()  # its own: the request's log closed when the body started (Flask tears the request down first)
    try:
        for chunk in chunks:
            hold.confirm()  # raises Unreplicated: the stream breaks off, and its client resumes from the primary
            hold.keep()
            if isinstance(chunk, bytes) and len(chunk) > WRITE_PIECE_BYTES:
                view = memoryview(chunk)
                for start in range(0, len(chunk), WRITE_PIECE_BYTES):
                    yield view[start : start + WRITE_PIECE_BYTES].tobytes()  # type: ignore[misc]
                    hold.keep()
            else:
                yield chunk
    finally:  # GeneratorExit too: the server closes the body when a write to a departed client fails
        close_log()
        hold.release()
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def held_response(hold: Hold, chunks: Iterable[Any], **response: Any) -> Response:
    """Return a streamed response whose hold is given back however it ends, even if it never starts.

    Under gunicorn, each write to its client must finish within the holds' ``write_timeout_s``: a client that stops
    reading (but keeps its connection open) is dropped then, rather than hold its connection, its greenlet and,
    once its unrenewed slot lapsed, none of its caller's quota, for good.
    """
    try:
        sock = request.environ.get("gunicorn.socket") if has_request_context() else None
        if sock is not None:
            sock.settimeout(hold.write_timeout_s)
        answer = Response(stream_with_context(held(hold, chunks)), **response)
    except BaseException:
        hold.release()
        raise
    answer.call_on_close(hold.release)
    return answer


def departure(environ: Mapping[str, Any]) -> Callable[[], bool]:
    """Return a check of whether this request's client has closed its end of the connection.

    A growing audio stream has nothing to write while it waits for a segment (audio has no keep-alive), so a
    client that left would otherwise be noticed only at the next segment, a stalled job's never. The check peeks
    at gunicorn's socket without waiting: readable with nothing to read is the client's close. Outside gunicorn
    (no socket in the environ), it says never.
    """
    sock = environ.get("gunicorn.socket")
    if sock is None:
        return lambda: False

    def gone() -> bool:
        try:
            readable, _, _ = select.select([sock], [], [], 0)  # gevent's select under gunicorn: never blocks here
            return bool(readable) and not sock.recv(1, socket.MSG_PEEK)
        except (OSError, ValueError):  # reset, or already closed
            return True

    return gone
