"""Callers listening while a fault strikes: when each heard each segment, to check it heard only what was kept.

A listener follows a job's event stream as a browser's EventSource does: when the stream breaks off (the store
away, an answer no replica confirmed), it reconnects with the Last-Event-ID it had. It notes when it first heard
each segment. A segment heard before the write of it that the store kept was heard from a write the store then
lost: an old primary's, after a failover. The kept write's time is its event's id in the job's stream (Redis's
clock, this machine's).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import redis

from cache import keys
from tests.chaos.stack import Stack

#: How long a listener waits before it reconnects (an EventSource's ``retry:``, as the API sends it).
RECONNECT_S = 1.0
#: The events that end a job's stream.
FINAL = frozenset({"done", "failed", "canceled", "expired"})


@dataclass
class Listener:
    """Follow one job's events until its final one; note when each segment was first heard."""

    stack: Stack
    job_id: str
    heard: dict[int, float] = field(default_factory=dict)  # segment → when first heard (epoch seconds)
    breaks: int = 0  # reconnects: a stream broke off, or could not open, before the job's final event
    final: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"listener-{self.job_id}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the job's final event, then stop listening."""
        if self._thread is not None:
            self._thread.join(timeout)
        self._stop.set()

    def _run(self) -> None:
        client = self.stack.client()
        while not self.final and not self._stop.is_set():
            headers = {"Last-Event-ID": str(max(self.heard))} if self.heard else {}
            try:
                response = client.get(f"/v1/jobs/{self.job_id}/events", headers=headers, buffered=False)
                if response.status_code == 200:
                    for chunk in response.response:
                        self._take(chunk.decode() if isinstance(chunk, bytes) else str(chunk))
                        if self.final or self._stop.is_set():
                            break
                response.close()
            except Exception:  # the stream broke off: the listener reconnects, as a browser would
                pass
            if not self.final:
                self.breaks += 1
                self._stop.wait(RECONNECT_S)

    def _take(self, chunk: str) -> None:
        for block in chunk.split("\n\n"):
            lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
            event = lines.get("event")
            if event == "segment":
                self.heard.setdefault(int(lines["id"]), time.time())
            elif event in FINAL:
                self.final = event


def listen(stack: Stack, job_ids: list[str]) -> list[Listener]:
    """Start a listener on each job."""
    listeners = [Listener(stack, job_id) for job_id in job_ids]
    for listener in listeners:
        listener.start()
    return listeners


def heard_before_kept(client: redis.Redis, listener: Listener) -> list[int]:
    """Return the segments ``listener`` heard before the store's kept write of them (or that it has no write of)."""
    kept: dict[int, int] = {}
    for raw_id, fields in client.xrange(keys.events(listener.job_id)):
        if fields[b"type"] == b"segment":
            kept.setdefault(int(fields[b"index"]), int(raw_id.decode().partition("-")[0]))
    return sorted(i for i, at in listener.heard.items() if i not in kept or at * 1000 < kept[i])
