"""The closed loop's clients: the service over HTTP (submit, follow the events, fetch segments), the baseline."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from urllib.parse import urlsplit

from bench.loadgen import JobResult
from client.sse import parse_sse

#: Answers that refuse work on purpose (admission control), to be retried after Retry-After.
ADMISSION_STATUSES = frozenset({429, 503})


#: The estimate each admission check puts in its 503's error body, and the check's name.
CHECKS = {"estimated_first_audio_s": "first audio", "estimated_excess_s": "deadlines", "estimated_wait_s": "wait"}


def refusing_check(body: bytes) -> str | None:
    """Return which admission check a refusal's JSON error body comes from, or None when it does not say."""
    try:
        error = json.loads(body).get("error", {})
    except (ValueError, AttributeError):
        return None
    return next((name for key, name in CHECKS.items() if key in error), None)


class Http:
    """One keep-alive HTTP connection per thread, reopened once if the server closed an idle one."""

    def __init__(self, base_url: str, *, timeout_s: float) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.timeout_s = timeout_s
        self._local = threading.local()

    def close(self) -> None:
        """Close the calling thread's connection, if it has one."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def connect(self) -> http.client.HTTPConnection:
        """Return a new connection (for a stream that keeps it busy)."""
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)

    def exchange(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, http.client.HTTPMessage, bytes, float]:
        """Return status, headers, body and the monotonic time of the body's first byte."""
        for attempt in (0, 1):
            conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
            reused = conn is not None
            if conn is None:
                conn = self._local.conn = self.connect()
            try:
                conn.request(method, path, body=body, headers=headers or {})
                response = conn.getresponse()
                head = response.read(1)
                first = time.monotonic()
                data = head + response.read()
                if response.will_close:
                    conn.close()
                    self._local.conn = None
                return response.status, response.headers, data, first
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                self._local.conn = None
                if not reused or attempt:
                    raise
        raise AssertionError("unreachable")


class ServedClient:
    """Submit to the service, follow the job's SSE stream and fetch each segment as it is announced."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        cache: bool = False,
        fixed_seed: int | None = None,
        timeout_s: float = 300,
        retry: bool = True,
        priority: str | None = None,
        mode: str | None = None,
    ) -> None:
        self.http = Http(base_url, timeout_s=timeout_s)
        self.model = model
        self.cache = cache
        self.fixed_seed = fixed_seed
        self.timeout_s = timeout_s
        self.retry = retry  # False: a refusal ends the job, with its status and Retry-After recorded
        self.priority = priority
        self.mode = mode  # None: the service's default (balanced)
        self._following: dict[int, str] = {}
        self._lock = threading.Lock()
        #: Refusals this client retried, by the admission check that refused.
        self.refusals: Counter[str] = Counter()

    def run_job(self, text: str, chars: int, seed: int) -> JobResult:
        """Submit ``text``, then play it as its segments arrive."""
        result = JobResult(chars=chars, submitted=time.monotonic())
        me = threading.get_ident()
        try:
            job = self._submit(text, seed, result)
            if job is not None:
                result.job_id = str(job["id"])
                with self._lock:
                    self._following[me] = str(job["id"])
                result.cached_segments = int(str(job.get("cached_segments", 0)))
                estimate = job.get("start_estimate_s")
                result.start_estimate_s = None if estimate is None else float(str(estimate))
                self._follow(str(job["id"]), result)
        except (OSError, http.client.HTTPException, ValueError) as e:
            result.error = type(e).__name__
        finally:
            with self._lock:
                self._following.pop(me, None)
        return result

    def _submit(self, text: str, seed: int, result: JobResult) -> dict[str, object] | None:
        if self.fixed_seed is not None:
            seed = self.fixed_seed  # the same seed for every job, so repeated texts can hit the cache
        body: dict[str, object] = {"text": text, "model": self.model, "seed": seed, "cache": self.cache}
        body["format"] = "wav"
        if self.priority:
            body["priority"] = self.priority
        if self.mode:
            body["mode"] = self.mode
        payload = json.dumps(body, ensure_ascii=False).encode()
        deadline = result.submitted + self.timeout_s
        while True:
            status, headers, data, _ = self.http.exchange(
                "POST", "/v1/jobs", payload, {"Content-Type": "application/json"}
            )
            if status == 202:
                result.admitted = time.monotonic()
                job: dict[str, object] = json.loads(data)
                return job
            retry_after = headers.get("Retry-After")
            if status in ADMISSION_STATUSES and not self.retry:
                result.refused = status
                result.retry_after = None if retry_after is None else float(retry_after)
                result.refused_by = refusing_check(data)
                result.error = f"POST {status}"
                return None
            if status in ADMISSION_STATUSES and retry_after is not None and time.monotonic() < deadline:
                result.admissions += 1
                with self._lock:
                    self.refusals[refusing_check(data) or "other"] += 1
                time.sleep(min(5.0, max(0.05, float(retry_after))))
                continue
            result.error = f"POST {status}"
            return None

    #: The job's event stream, as this client listens to it.
    events_path = "/v1/jobs/{job_id}/events"

    def _follow(self, job_id: str, result: JobResult) -> None:
        conn = self.http.connect()
        try:
            conn.request("GET", self.events_path.format(job_id=job_id), headers={"Accept": "text/event-stream"})
            response = conn.getresponse()
            if response.status != 200:
                result.error = f"events {response.status}"
                return
            for event in parse_sse(iter(response.readline, b"")):
                name = event["event"]
                if name == "done":
                    result.done = time.monotonic()
                    return
                if name in ("failed", "canceled", "expired"):
                    result.error = f"job {name}"
                    return
                self._heard(name, event["data"], result)
                if result.error:
                    return
            result.error = "events ended early"
        finally:
            conn.close()

    def _heard(self, name: str, data: dict[str, object], result: JobResult) -> None:
        """Act on one event of the job's stream before its end: fetch each segment announced."""
        if name == "segment":
            self._fetch(data, result)

    def _fetch(self, segment: dict[str, object], result: JobResult) -> None:
        status, headers, _, first = self.http.exchange("GET", str(segment["url"]))
        if status != 200:
            result.error = f"segment {status}"
            return
        if segment["index"] == 0:
            result.first_audio = first
        result.segments.append((time.monotonic(), float(headers.get("X-Segment-Duration", 0.0))))

    def abandon_all(self) -> None:
        """Cancel every job still followed, so none takes the engine's time from the next level."""
        with self._lock:
            jobs = list(self._following.values())
        for job_id in jobs:
            conn = self.http.connect()
            try:
                conn.request("DELETE", f"/v1/jobs/{job_id}")
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()


class BaselineClient:
    """Post the whole text to the synchronous server and read the whole WAV back."""

    def __init__(self, base_url: str, *, timeout_s: float = 600) -> None:
        self.http = Http(base_url, timeout_s=timeout_s)

    def run_job(self, text: str, chars: int, seed: int) -> JobResult:
        """Post ``text``; the answer is the audio, so the first byte comes when synthesis is over."""
        result = JobResult(chars=chars, submitted=time.monotonic())
        payload = json.dumps({"text": text, "seed": seed}, ensure_ascii=False).encode()
        try:
            status, headers, _, first = self.http.exchange(
                "POST", "/synthesize", payload, {"Content-Type": "application/json"}
            )
        except (OSError, http.client.HTTPException) as e:
            result.error = type(e).__name__
            return result
        if status != 200:
            result.error = f"POST {status}"
            return result
        result.done = time.monotonic()
        result.first_audio = first
        result.segments.append((result.done, float(headers.get("X-Audio-Duration", 0.0))))
        return result

    def abandon_all(self) -> None:
        """Do nothing: a synchronous request cannot be taken back."""
