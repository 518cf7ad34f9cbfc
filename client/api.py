"""A small HTTP client of the TTS service: submit, follow, fetch segments, download."""

from __future__ import annotations

import codecs
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import requests

TERMINAL = frozenset({"done", "failed", "canceled"})
#: Longest ``?wait=`` the service accepts (``TTS_MAX_WAIT_S``); longer asks are a 422.
LONG_POLL_S = 30.0
#: How many times ``events`` reconnects in a row without receiving anything new.
SSE_RECONNECTS = 5


class TTSClientError(Exception):
    """Raised when the service answers with an error, cannot be reached, or a job fails."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def _error_from(response: requests.Response) -> TTSClientError:
    try:
        body = response.json()["error"]
        return TTSClientError(response.status_code, str(body["code"]), str(body.get("message", "")))
    except (ValueError, KeyError, TypeError):
        return TTSClientError(response.status_code, "http_error", response.text[:200] or response.reason)


class TTSClient:
    """Talk to one TTS service at ``base_url``; ``timeout`` bounds every connect and read.

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
        self.session = session or requests.Session()
        self.timeout = timeout

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
                **kwargs,
            )
        except requests.RequestException as e:
            raise TTSClientError(0, "unreachable", f"{method} {self._url(path)} failed: {e}") from e
        if response.status_code >= 400:
            error = _error_from(response)
            response.close()
            raise error
        return response

    def submit(self, text: str, **options: Any) -> dict[str, Any]:
        """Submit ``text`` as a job (options: model, voice, speed, mode, format, priority, seed, cache)."""
        body = {"text": text, **{k: v for k, v in options.items() if v is not None}}
        job: dict[str, Any] = self._request("POST", "/v1/jobs", json=body).json()
        return job

    def status(self, job_id: str) -> dict[str, Any]:
        """Return the job's status and progress."""
        job: dict[str, Any] = self._request("GET", f"/v1/jobs/{job_id}").json()
        return job

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel the job; segments not yet made are skipped."""
        job: dict[str, Any] = self._request("DELETE", f"/v1/jobs/{job_id}").json()
        return job

    def models(self) -> dict[str, Any]:
        """Return the model registry: the default model and each model's voices."""
        registry: dict[str, Any] = self._request("GET", "/v1/models").json()
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

    def segment(self, job_id: str, index: int, *, wait: float = LONG_POLL_S) -> tuple[bytes, float, int]:
        """Return segment ``index`` as (audio, duration in seconds, sample rate), long-polling until it exists."""
        while True:
            try:
                response = self._request("GET", f"/v1/jobs/{job_id}/segments/{index}?wait={wait:g}", read_s=wait)
            except TTSClientError as e:
                if e.code == "not_ready":
                    continue  # the long-poll ran out; the job is still going
                raise
            duration = float(response.headers.get("X-Segment-Duration", "0"))
            return response.content, duration, int(response.headers.get("X-Sample-Rate", "0"))

    def segments(self, job_id: str, *, start: int = 0) -> Iterator[tuple[int, bytes, float]]:
        """Yield (index, audio, duration) for each segment from ``start`` on, in order, as soon as each exists."""
        total = int(self.status(job_id)["segments_total"])
        for index in range(start, total):
            audio, duration, _ = self.segment(job_id, index)
            yield index, audio, duration

    def events(self, job_id: str, *, last_event_id: str | int | None = None) -> Iterator[dict[str, Any]]:
        """Yield the job's server-sent events ({"event", "id", "data"}), reconnecting after drops, until it ends."""
        failures = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_event_id is not None:
                headers["Last-Event-ID"] = str(last_event_id)
            received = False
            try:
                with self._request(
                    "GET", f"/v1/jobs/{job_id}/events", headers=headers, stream=True, read_s=60.0
                ) as response:
                    for event in parse_sse(response.iter_content(chunk_size=None)):
                        received = True
                        if event["id"] is not None:
                            last_event_id = event["id"]
                        yield event
                        if event["event"] in TERMINAL or event["event"] == "expired":
                            return
            except (TTSClientError, requests.RequestException) as e:
                if isinstance(e, TTSClientError) and e.status != 0:
                    raise
            failures = 0 if received else failures + 1
            if failures > SSE_RECONNECTS:
                raise TTSClientError(0, "stream_lost", f"the event stream of job {job_id} kept dropping")
            time.sleep(min(0.2 * failures, 2.0))

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
            response = self._request(
                "GET", f"/v1/jobs/{job_id}/audio", headers=headers, stream=True, read_s=LONG_POLL_S
            )
        except TTSClientError as e:
            if e.code != "not_ready":
                raise
            # Formats that cannot grow (flac, ogg) are only served whole, once the job is done.
            self.wait(job_id)
            response = self._request("GET", f"/v1/jobs/{job_id}/audio", headers=headers, stream=True)
        with response:
            appending = response.status_code == 206 and response.headers.get("Content-Range", "").startswith(
                f"bytes {offset}-"
            )
            done = offset if appending else 0
            length = response.headers.get("Content-Length")
            total = done + int(length) if length is not None and "Content-Encoding" not in response.headers else None
            try:
                with partial.open("ab" if appending else "wb") as out:
                    for chunk in response.iter_content(chunk_size=64 * 1024):
                        out.write(chunk)
                        done += len(chunk)
                        if on_progress is not None:
                            on_progress(done, total)
            except requests.RequestException as e:
                raise TTSClientError(0, "unreachable", f"download of job {job_id} broke off: {e}") from e
        partial.replace(target)
        return target


def parse_sse(chunks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """Yield the events ({"event", "id", "data"}) of a server-sent stream cut into chunks anywhere (WHATWG rules)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    event: str | None = None
    event_id: str | None = None
    data: list[str] = []
    for chunk in chunks:
        text = pending + decoder.decode(chunk)
        # A CR at the end may be half of a CRLF whose LF is in the next chunk.
        held = "\r" if text.endswith("\r") else ""
        *lines, pending = text[: len(text) - len(held)].replace("\r\n", "\n").replace("\r", "\n").split("\n")
        pending += held
        for line in lines:
            if not line:
                if data:
                    joined = "\n".join(data)
                    try:
                        payload: Any = json.loads(joined)
                    except ValueError:
                        payload = joined
                    yield {"event": event or "message", "id": event_id, "data": payload}
                event, event_id, data = None, None, []
                continue
            if line.startswith(":"):
                continue  # a comment: the service's keep-alive
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id" and "\0" not in value:
                event_id = value


#: The parser's earlier, private name.
_parse_sse = parse_sse
