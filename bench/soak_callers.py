"""The soak's closed-loop callers: submit a mix of lengths, follow or poll each job, sometimes download it."""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from dataclasses import dataclass, field

from client.sse import parse_sse
from devstack.local import ROOT

SENTENCES = [line.strip() for line in (ROOT / "bench" / "corpus_zh.txt").read_text().splitlines() if line.strip()]


def text_of(kind: str, rng: random.Random) -> str:
    """Return a text of the kind: short (1–2 sentences), paragraph (~400 chars) or book (~12,000 chars)."""
    target = {"short": 30, "paragraph": 400, "book": 12_000}[kind]
    parts: list[str] = []
    while sum(map(len, parts)) < target:
        parts.append(rng.choice(SENTENCES))
        if kind == "book" and rng.random() < 0.15:
            parts.append("\n\n")
    return "".join(parts)


@dataclass
class Tally:
    """What the callers saw, counted under a lock."""

    accepted: int = 0
    admission: int = 0  # 429 and 503: deliberate answers
    errors: list[str] = field(default_factory=list)
    done: int = 0
    downloads: int = 0
    open_jobs: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def error(self, what: str) -> None:
        with self.lock:
            self.errors.append(what)


class Caller:
    """One closed-loop caller: submit, follow (events) or poll, sometimes download, repeat."""

    def __init__(self, port: int, tally: Tally, seed: int, stop: threading.Event, *, books: bool) -> None:
        self.port, self.tally, self.stop, self.books = port, tally, stop, books
        self.rng = random.Random(seed)

    def request(
        self, method: str, path: str, body: dict[str, object] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=payload, headers={"Content-Type": "application/json"} if body else {})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.one()
            except (OSError, http.client.HTTPException) as e:
                self.tally.error(f"connection: {e!r}")
                self.stop.wait(1)

    def one(self) -> None:
        kind = "book" if self.books else ("short" if self.rng.random() < 0.65 else "paragraph")
        status, headers, data = self.request("POST", "/v1/jobs", {"text": text_of(kind, self.rng)})
        if status in (429, 503):
            with self.tally.lock:
                self.tally.admission += 1
            self.stop.wait(min(10.0, float(headers.get("Retry-After", "1"))))
            return
        if status != 202:
            self.tally.error(f"submit {status}: {data[:200]!r}")
            return
        job_id = json.loads(data)["id"]
        with self.tally.lock:
            self.tally.accepted += 1
            self.tally.open_jobs.add(job_id)
        view = self.follow(job_id) if kind != "book" else self.poll(job_id)
        if view is None:
            return
        if view["status"] != "done":
            self.tally.error(f"job {job_id} ended {view['status']}: {view.get('error')}")
        elif kind == "book" or self.rng.random() < 0.3:
            status, _, audio = self.request("GET", f"/v1/jobs/{job_id}/audio")
            if status != 200 or not audio:
                self.tally.error(f"audio {status} for {job_id}")
            with self.tally.lock:
                self.tally.downloads += 1
        with self.tally.lock:
            self.tally.open_jobs.discard(job_id)
            if view["status"] == "done":
                self.tally.done += 1

    def follow(self, job_id: str) -> dict[str, object] | None:
        """Read the job's event stream to its end, then return the job."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("GET", f"/v1/jobs/{job_id}/events")
            response = conn.getresponse()
            if response.status != 200:
                self.tally.error(f"events {response.status} for {job_id}")
                return None
            for event in parse_sse(response):
                if event["event"] != "segment":
                    break
        finally:
            conn.close()
        return self.poll(job_id)

    def poll(self, job_id: str) -> dict[str, object] | None:
        """Poll the job until it ends (books: every 2 s)."""
        while True:
            status, _, data = self.request("GET", f"/v1/jobs/{job_id}")
            if status != 200:
                self.tally.error(f"poll {status} for {job_id}")
                return None
            view: dict[str, object] = json.loads(data)
            if view["status"] in ("done", "failed", "canceled"):
                return view
            time.sleep(2)
