"""A small HTTP client of the TTS service: submit, follow, fetch segments, download, stream text in pieces."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import requests

from client.deadline import HeadersDueAdapter
from client.download import save_answer
from client.errors import TTSClientError, error_from, read_answer
from client.fragments import Fragment, fragments_of
from client.sse import parse_sse, reconnecting
from client.text_stream import TextStream
from client.waits import LONG_POLL_S, MIN_POLL_S, allowed_wait

__all__ = ["Fragment", "TTSClient", "TTSClientError", "TextStream", "allowed_wait", "is_open_stream", "parse_sse"]

TERMINAL = frozenset({"done", "failed", "canceled"})
#: The events after which a job's event stream ends.
ENDING_EVENTS = TERMINAL | {"expired"}
#: How many times a text piece is sent in all when the service is briefly busy (503) or cannot be reached.
PIECE_ATTEMPTS = 6
#: The longest pause between two tries of a piece, whatever Retry-After says.
PIECE_RETRY_MAX_S = 5.0


def is_open_stream(job: dict[str, Any]) -> bool:
    """Say whether ``job`` (a job view) is a text stream that may still take pieces, so more segments may come."""
    stream = job.get("text_stream")
    return bool(stream and stream.get("open"))


def _session() -> requests.Session:
    """Return a session whose answers' headers must all arrive within each request's read timeout."""
    session = requests.Session()
    adapter = HeadersDueAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class TTSClient:
    """Talk to one TTS service at ``base_url``; ``timeout`` bounds every connect and read, the whole wait for an
    answer's headers (with a long-poll's wait added) and the whole of a JSON answer's body, however slowly a
    server trickles them (client/deadline.py; with a session of its own: one passed in keeps requests' bounds).

    ``api_key``, when given, goes with every request as ``Authorization: Bearer <key>`` (the service asks for one
    when it runs with ``TTS_API_KEYS``). A ``session`` passed in is used as it is: the key is added to each
    request, not to the session's own headers.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        session: requests.Session | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key or None
        self._owns_session = session is None
        self.session = session or _session()
        self.timeout = timeout
        #: The ``?wait=`` of each long-poll: ``LONG_POLL_S``, lowered once the service refuses it as too long.
        self.long_poll_s = LONG_POLL_S

    def close(self) -> None:
        """Close the connections of the session this client made (a session passed in stays open)."""
        if self._owns_session:
            self.session.close()

    def __enter__(self) -> TTSClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else f"{self.base_url}{path}"

    def _headers(self, extra: dict[str, str] | None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return {**headers, **(extra or {})}

    def _request(
        self, method: str, path: str, *, read_s: float = 0.0, headers: dict[str, str] | None = None, **kwargs: Any
    ) -> requests.Response:
        try:
            response = self.session.request(
                method,
                self._url(path),
                headers=self._headers(headers),
                timeout=(self.timeout, self.timeout + read_s),
                **{"stream": True, **kwargs},  # bodies are read as they are used: JSON ones bounded (read_answer)
            )
        except requests.RequestException as e:
            raise TTSClientError(0, "unreachable", f"{method} {self._url(path)} failed: {e}") from e
        if response.status_code >= 400:
            raise error_from(response, within_s=self.timeout)  # it reads (and closes) the answer
        return response

    def _long_poll(
        self, method: str, path: str, *, wait: float | None = None, read_s: float = 0.0, **kwargs: Any
    ) -> requests.Response:
        """Send a request that waits up to ``wait`` seconds (``long_poll_s`` by default) on the service, each read
        allowed that wait or ``read_s`` more; a wait the service refuses as too long is lowered to what it allows,
        for this and every later long-poll."""
        asked = self.long_poll_s if wait is None else wait
        while True:
            try:
                return self._request(method, f"{path}?wait={asked:g}", read_s=max(asked, read_s), **kwargs)
            except TTSClientError as e:
                lower = allowed_wait(e, asked)
                if lower is None:
                    raise
                asked = lower
                self.long_poll_s = min(self.long_poll_s, lower)

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """Send a request and return its JSON object answer, read within the client's timeout."""
        return read_answer(self._request(method, path, **kwargs), within_s=self.timeout)

    def submit(self, text: str, **options: Any) -> dict[str, Any]:
        """Submit ``text`` as a job (options: model, voice, speed, mode, format, priority, seed, cache)."""
        body = {"text": text, **{k: v for k, v in options.items() if v is not None}}
        job: dict[str, Any] = self._json("POST", "/v1/jobs", json=body)
        if not isinstance(job.get("id"), str):
            raise TTSClientError(0, "bad_answer", f"POST {self._url('/v1/jobs')}: the answer names no job id")
        return job

    def open_stream(self, text: str = "", **options: Any) -> TextStream:
        """Open a job whose text arrives in pieces (``text``: nothing yet, or the first piece); the options are
        ``submit``'s. Send the rest with the returned stream's ``send`` and end it with ``finish``."""
        return TextStream(self, self.submit(text, text_stream=True, **options))

    def send_text(
        self, job_id: str, seq: int, text: str, *, final: bool = False, attempts: int = PIECE_ATTEMPTS
    ) -> dict[str, Any]:
        """Send piece ``seq`` of a text stream and return the answer ({"seq", "duplicate", "segments_total",
        "text_stream"}). A 503 or a failed connection is tried again with the same seq, up to ``attempts`` in
        all: the service takes a piece once, so a retry of one it took is answered ``duplicate`` and not spoken
        twice."""
        body = {"seq": seq, "text": text, "final": final}
        attempt = 1
        while True:
            try:
                answer: dict[str, Any] = self._json("POST", f"/v1/jobs/{job_id}/text", json=body)
                return answer
            except TTSClientError as e:
                if e.status not in (0, 503) or attempt >= attempts:
                    raise
                pause = e.retry_after if e.retry_after is not None else 0.2 * 2 ** (attempt - 1)
                time.sleep(min(max(pause, 0.0), PIECE_RETRY_MAX_S))
            attempt += 1

    def status(self, job_id: str) -> dict[str, Any]:
        """Return the job's status and progress."""
        job: dict[str, Any] = self._json("GET", f"/v1/jobs/{job_id}")
        return job

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel the job; segments not yet made are skipped."""
        job: dict[str, Any] = self._json("DELETE", f"/v1/jobs/{job_id}")
        return job

    def models(self) -> dict[str, Any]:
        """Return the model registry: the default model and each model's voices."""
        registry: dict[str, Any] = self._json("GET", "/v1/models")
        return registry

    def wait(
        self, job_id: str, *, on_progress: Callable[[dict[str, Any]], None] | None = None, poll_s: float = 0.5
    ) -> dict[str, Any]:
        """Poll until the job is done and return it; raise if it failed or was canceled."""
        while True:
            job = self.status(job_id)
            if on_progress is not None:
                on_progress(job)
            if job["status"] == "done":
                return job
            if job["status"] in TERMINAL:
                raise TTSClientError(409, "job_failed", f"job {job['status']}: {job.get('error', 'no reason')}")
            time.sleep(poll_s)

    def segment(self, job_id: str, index: int, *, wait: float | None = None) -> tuple[bytes, float, int]:
        """Return segment ``index`` as (audio, duration in seconds, sample rate), long-polling until it exists
        (``wait``: each poll's, ``long_poll_s`` by default)."""
        while True:
            started = time.monotonic()
            try:
                response = self._long_poll("GET", f"/v1/jobs/{job_id}/segments/{index}", wait=wait)
            except TTSClientError as e:
                if e.code != "not_ready":
                    raise
                # The long-poll ran out and the job is still going; a service with a very short one (or a wait
                # lowered to 0) must not make this a busy loop.
                time.sleep(max(0.0, MIN_POLL_S - (time.monotonic() - started)))
                continue
            duration = float(response.headers.get("X-Segment-Duration", "0"))
            return response.content, duration, int(response.headers.get("X-Sample-Rate", "0"))

    def segments(self, job_id: str, *, start: int = 0) -> Iterator[tuple[int, bytes, float]]:
        """Yield (index, audio, duration) for each segment from ``start`` on, in order, as soon as each exists.

        A text stream still open has no final ``segments_total``: its segments are followed by the job's events
        until the stream closes and the last one is made (raising if the job fails or is canceled on the way).
        """
        job = self.status(job_id)
        if is_open_stream(job):
            yield from self._followed_segments(job_id, start)
            return
        for index in range(start, int(job["segments_total"])):
            audio, duration, _ = self.segment(job_id, index)
            yield index, audio, duration

    def _followed_segments(self, job_id: str, start: int) -> Iterator[tuple[int, bytes, float]]:
        following = start
        try:
            for event in self.events(job_id, last_event_id=start - 1 if start > 0 else None):
                if event["event"] == "segment":
                    index = int(event["data"]["index"])
                    if index >= start:
                        audio, duration, _ = self.segment(job_id, index)
                        following = index + 1
                        yield index, audio, duration
                elif event["event"] in ENDING_EVENTS:
                    if event["event"] != "done":
                        raise TTSClientError(409, "job_failed", f"job {event['event']}: {event['data']}")
                    return
        except TTSClientError as e:
            # A stream that ended with no segment left to fetch (none at all: only blanks or symbols were sent)
            # has no audio, which the service's events answer as 410 gone: there is nothing more to yield.
            if e.status != 410:
                raise
            job = self.status(job_id)
            if job["status"] != "done" or int(job["segments_total"]) > following:
                raise

    def events(
        self, job_id: str, *, last_event_id: str | int | None = None, fragments: bool = False
    ) -> Iterator[dict[str, Any]]:
        """Yield the job's server-sent events ({"event", "id", "data"}), reconnecting after drops, until it ends;
        with ``fragments``, a ``fragment`` event for each fragment of audio too (its PCM inline, base64)."""
        path = f"/v1/jobs/{job_id}/events" + ("?fragments=1" if fragments else "")

        def connect(headers: dict[str, str]) -> requests.Response:
            return self._request("GET", path, headers=headers, stream=True, read_s=60.0)

        yield from reconnecting(connect, f"job {job_id}", last_event_id=last_event_id, ends=ENDING_EVENTS)

    def fragments(self, job_id: str, *, after: str | None = None) -> Iterator[Fragment]:
        """Yield the job's audio as it is made: (segment, number, pcm, sample_rate, last) for each fragment in order,
        across segments, each once (a segment's fragments join into exactly its audio, as raw 16-bit PCM), until
        the job is done; raise if it fails or is canceled.

        They come inline in the job's event stream, which is followed again after a drop from the last fragment
        had (``Last-Event-ID``); ``after`` (an event id, ``"<index>.<number>"`` or ``"<index>"``) starts after it.
        Each segment ends with a fragment whose ``last`` is true (see ``client.fragments.fragments_of``).
        """
        ended = 0
        try:
            for fragment in fragments_of(self.events(job_id, last_event_id=after, fragments=True), after=after):
                ended += fragment.last
                yield fragment
        except TTSClientError as e:
            # A text stream that ended with nothing to speak has no audio, which the events answer as 410 gone.
            if e.status != 410:
                raise
            job = self.status(job_id)
            if job["status"] != "done" or int(job["segments_total"]) > ended:
                raise

    def download(
        self,
        job_id: str,
        path: str | os.PathLike[str],
        *,
        resume: bool = True,
        on_progress: Callable[[int, int | None], None] | None = None,
    ) -> Path:
        """Save the job's whole audio file at ``path`` (via ``<path>.part``), resuming a partial one by Range."""
        target = Path(path)
        partial = target.with_name(target.name + ".part")
        offset = partial.stat().st_size if resume and partial.is_file() else 0
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            # The wait is the client's, so that a service with a longer one cannot outlast the read timeout; a
            # growing body's reads keep their own bound, however short the wait.
            response = self._long_poll(
                "GET", f"/v1/jobs/{job_id}/audio", headers=headers, stream=True, read_s=LONG_POLL_S
            )
        except TTSClientError as e:
            if e.code != "not_ready":
                raise
            # Formats that cannot grow (flac, ogg) are only served whole, once the job is done.
            self.wait(job_id)
            response = self._request("GET", f"/v1/jobs/{job_id}/audio", headers=headers, stream=True)
        with response:
            save_answer(response, partial, offset=offset, on_progress=on_progress, what=f"download of job {job_id}")
        partial.replace(target)
        return target
