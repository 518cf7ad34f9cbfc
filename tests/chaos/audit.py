"""Check every accepted job after a fault: ended, each segment exactly once, and a resumed stream without gaps."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
from flask.testing import FlaskClient

from cache import keys
from tests.support.servers import ROOT

#: Where `make chaos` reads its table from; CHAOS_RESULTS moves it (say, out of the tree in CI).
RESULTS = Path(os.environ.get("CHAOS_RESULTS", ROOT / "bench" / "results" / "chaos.jsonl"))


@dataclass
class Audit:
    """What became of a scenario's accepted jobs, and every problem found, one line each."""

    scenario: str
    accepted: int = 0
    done: int = 0
    failed: int = 0  # failed with a reason
    lost: int = 0  # not ended, ended without a reason, or done with a segment missing
    duplicated: int = 0  # segment events beyond the first per index
    seconds: float = 0.0
    affected: int = 0  # jobs still unfinished when the fault struck
    recovery_p99_s: float | None = None  # fault → an affected job's end, 99th percentile
    recovery_s: float | None = None  # fault → every affected job ended
    ready_again_s: float | None = None  # fault → /readyz answering 200 for good
    accepting_again_s: float | None = None  # fault → the first new job answered 202
    refused_meanwhile: int | None = None  # submissions answered 503 between the fault and that 202
    notes: str = ""
    failures: dict[str, str] = field(default_factory=dict)  # job id → the reason it failed with
    problems: list[str] = field(default_factory=list)
    ended_at: list[float] = field(default_factory=list)  # each ended job's finished_at (epoch seconds)

    def row(self) -> dict[str, Any]:
        """Return the scenario's result row, as `make chaos` tabulates it."""
        found = asdict(self)
        del found["failures"], found["problems"], found["ended_at"]
        return {**found, "seconds": round(self.seconds, 1), "at": time.strftime("%Y-%m-%dT%H:%M:%S")}

    def recovered_from(self, fault_at: float) -> None:
        """Set the recovery times of the jobs that ended after a fault struck at ``fault_at`` (epoch seconds)."""
        after = sorted(end - fault_at for end in self.ended_at if end > fault_at)
        self.affected = len(after)
        if after:
            self.recovery_s = round(after[-1], 1)
            self.recovery_p99_s = round(after[min(len(after) - 1, int(0.99 * len(after)))], 1)

    def record(self) -> None:
        """Append the result row to the results file."""
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with RESULTS.open("a", encoding="utf-8") as out:
            out.write(json.dumps(self.row()) + "\n")


def sse_segments(
    client: FlaskClient, job_id: str, last_event_id: int | None = None, *, headers: Mapping[str, str] | None = None
) -> tuple[list[int], str]:
    """Read the job's event stream (resuming after ``last_event_id``); return segment ids and the final event."""
    sent = dict(headers or {})
    if last_event_id is not None:
        sent["Last-Event-ID"] = str(last_event_id)
    response = client.get(f"/v1/jobs/{job_id}/events", headers=sent)
    if response.status_code != 200:
        return [], f"HTTP {response.status_code}"
    ids, final = [], ""
    for block in response.get_data(as_text=True).split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if lines.get("event") == "segment":
            ids.append(int(lines["id"]))
        elif "event" in lines:
            final = lines["event"]
    return ids, final


def audit_job(
    audit: Audit, client: FlaskClient, client_redis: redis.Redis, job_id: str, headers: Mapping[str, str]
) -> None:
    """Check one accepted job and add what it came to into ``audit``."""
    record = {k.decode(): v.decode() for k, v in client_redis.hgetall(keys.job(job_id)).items()}
    status = record.get("status")
    if "finished_at" in record:
        audit.ended_at.append(float(record["finished_at"]))
    if status == "failed" and record.get("error"):
        audit.failed += 1
        audit.failures[job_id] = record["error"]
        return
    if status != "done":
        audit.lost += 1
        where = _whereabouts(client_redis, job_id, record)
        audit.problems.append(f"job {job_id} ended {status!r} with error {record.get('error')!r}; {where}")
        return
    total = int(record["segments_total"])
    stored = sorted(int(k) for k in client_redis.hkeys(keys.audio(job_id)))
    events = Counter(
        int(fields[b"index"]) for _, fields in client_redis.xrange(keys.events(job_id)) if fields[b"type"] == b"segment"
    )
    duplicates = {i: n for i, n in events.items() if n > 1}
    if duplicates:
        audit.duplicated += sum(n - 1 for n in duplicates.values())
        audit.problems.append(f"job {job_id}: segment events repeated {duplicates}")
    gaps = []
    if stored != list(range(total)):
        gaps.append(f"audio hash holds {stored}, not 0..{total - 1}")
    if sorted(events) != list(range(total)):
        gaps.append(f"segment events for {sorted(events)}, not 0..{total - 1}")
    whole, final = sse_segments(client, job_id, headers=headers)
    if whole != list(range(total)) or final != "done":
        gaps.append(f"SSE gave {whole} then {final!r}")
    resume_after = (sum(map(ord, job_id)) % total) - 1  # a fixed, job-dependent k in -1..N-2
    resumed, final = sse_segments(client, job_id, resume_after if resume_after >= 0 else None, headers=headers)
    if resumed != list(range(resume_after + 1, total)) or final != "done":
        gaps.append(f"SSE resumed after {resume_after} gave {resumed} then {final!r}")
    if gaps:
        audit.lost += 1
        audit.problems.extend(f"job {job_id}: {gap}" for gap in gaps)
    else:
        audit.done += 1


def _whereabouts(client_redis: redis.Redis, job_id: str, record: dict[str, str]) -> str:
    """Say where an unfinished job's missing segments are: held by whom, in the outbox, pending, how tried."""
    total = int(record.get("segments_total", 0))
    written = {int(k) for k in client_redis.hkeys(keys.audio(job_id))}
    missing = [i for i in range(total) if i not in written]
    holders = {
        key.decode().removeprefix("tts:held:"): {m.decode() for m in client_redis.smembers(key)}
        for key in client_redis.scan_iter(match="tts:held:*")
    }
    where = {}
    for index in missing:
        member = keys.segment_member(job_id, index)
        held_by = [name for name, members in holders.items() if member in members]
        outbox = client_redis.zscore(keys.OUTBOX, member)
        where[index] = f"held by {held_by}" if held_by else ("in the outbox" if outbox is not None else "nowhere")
    attempts = {k.decode(): v.decode() for k, v in client_redis.hgetall(keys.attempts(job_id)).items()}
    pending = [p.decode() for p in client_redis.lrange(keys.pending(job_id), 0, -1)]
    beats = {n.decode(): round(s) for n, s in client_redis.zrange(keys.WORKERS, 0, -1, withscores=True)}
    return f"missing {where}, attempts {attempts}, pending {pending}, workers {beats}"


def audit_jobs(
    scenario: str,
    client: FlaskClient,
    client_redis: redis.Redis,
    job_ids: list[str],
    *,
    headers: Mapping[str, str] | Mapping[str, Mapping[str, str]] | None = None,
) -> Audit:
    """Check every accepted job of a scenario.

    ``headers`` carry an API key where the API wants one: the same for every job, or by job id (with keys on, a
    job answers only the key that submitted it)."""
    audit = Audit(scenario, accepted=len(job_ids))
    for job_id in job_ids:
        found = (headers or {}).get(job_id)
        sent = found if isinstance(found, Mapping) else headers
        audit_job(audit, client, client_redis, job_id, sent or {})  # type: ignore[arg-type]
    return audit
