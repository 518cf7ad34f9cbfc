"""``tts book``: turn a chapter into audio through one job, keeping each segment on disk as it comes, so that a run
cut off (Ctrl-C, a lost connection, a job whose audio the service no longer keeps) resumes where it stopped."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path
from typing import Any, TextIO

from client.api import TTSClient
from client.audio import check_supported, output_format, write_audio
from client.errors import TTSClientError
from client.progress import ProgressBar

STATE_NAME = "job.json"


class BookState:
    """A cut-off book run on disk: ``job.json`` (job id, request fingerprint, rate) beside ``seg-NNNNN.pcm`` files."""

    def __init__(self, state_file: Path) -> None:
        self.file = state_file
        self.folder = state_file.parent
        self.data: dict[str, Any] = {}
        if state_file.is_file():
            try:
                self.data = json.loads(state_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self.data = {}  # a torn or foreign file: start over rather than guess

    def save(self, **changes: Any) -> None:
        """Update and write the state atomically."""
        self.data.update(changes)
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = self.file.with_name(self.file.name + ".tmp")
        temporary.write_text(json.dumps(self.data, indent=2), encoding="utf-8")
        temporary.replace(self.file)

    def segment_path(self, index: int) -> Path:
        """Return where segment ``index`` is kept."""
        return self.folder / f"seg-{index:05d}.pcm"

    def put_segment(self, index: int, pcm: bytes) -> None:
        """Keep one segment; it only appears under its name once wholly written."""
        temporary = self.segment_path(index).with_suffix(".tmp")
        temporary.write_bytes(pcm)
        temporary.replace(self.segment_path(index))

    def have(self, total: int) -> list[int]:
        """Return the indices of the segments already kept."""
        return [i for i in range(total) if self.segment_path(i).is_file()]

    def clear(self) -> None:
        """Remove the kept segments and the state file, and the folder if nothing else is in it."""
        for path in [*self.folder.glob("seg-*.pcm"), *self.folder.glob("seg-*.tmp"), self.file]:
            path.unlink(missing_ok=True)
        self.data = {}
        with contextlib.suppress(OSError):  # absent, or it holds files that are not ours
            self.folder.rmdir()


def _fingerprint(request: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


#: What the service chose for a job that decides its segments: the same text planned with the same choices is cut
#: into the same segments (the seed, when none is given, is 0), so a new job's segments may replace a lost job's.
PLAN_KEYS = ("model", "voice", "speed", "mode", "seed", "segments_total", "chars_total")
#: How long a book waits in all for the service to admit it (503 with Retry-After: its store or engines are full
#: of other work), and the longest pause between two tries, whatever Retry-After says.
BOOK_ADMISSION_WAIT_S = 1800.0
BOOK_RETRY_MAX_S = 60.0


def _submit_when_admitted(
    client: TTSClient, request: dict[str, Any], log: TextIO, *, wait_s: float = BOOK_ADMISSION_WAIT_S
) -> dict[str, Any]:
    """Submit a book, waiting out each 503 that says when to try again (Retry-After), for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return client.submit(**request)
        except TTSClientError as e:
            if e.status != 503 or e.retry_after is None:
                raise
            pause = min(max(e.retry_after, 1.0), BOOK_RETRY_MAX_S)
            if time.monotonic() + pause > deadline:
                raise
            print(f"not admitted yet ({e.code}: {e.message}); trying again in {pause:g} s", file=log, flush=True)
            time.sleep(pause)


def _plan(job: dict[str, Any]) -> dict[str, Any]:
    return {key: job.get(key) for key in PLAN_KEYS}


def _reuse_or_submit(client: TTSClient, state: BookState, request: dict[str, Any], log: TextIO) -> dict[str, Any]:
    fingerprint = _fingerprint(request)
    job_id = state.data.get("job_id")
    if job_id and state.data.get("fingerprint") == fingerprint:
        try:
            job = client.status(job_id)
        except TTSClientError as e:
            if e.status != 404:
                raise
            return _submit_again(client, state, request, log, why=f"job {job_id} is gone from the server (expired)")
        if job["status"] not in ("failed", "canceled"):
            return job
        # A job failed (its store full, say) or canceled: the segments saved before are as good as a new job's.
        reason = f": {job['error']}" if job.get("error") else ""
        return _submit_again(client, state, request, log, why=f"job {job_id} {job['status']}{reason}")
    elif job_id:
        print("the text or options changed since the cut-off run; starting again", file=log)
    state.clear()
    job = _submit_when_admitted(client, request, log)
    state.save(job_id=job["id"], fingerprint=fingerprint, segments_total=job["segments_total"], plan=_plan(job))
    return job


def _submit_again(
    client: TTSClient, state: BookState, request: dict[str, Any], log: TextIO, *, why: str
) -> dict[str, Any]:
    """Submit the text again for a job whose audio is lost, keeping the segments saved if it plans the same."""
    job = _submit_when_admitted(client, request, log)
    # A state saved before plans were recorded knows the segment count only.
    planned = state.data.get("plan") or {"segments_total": state.data.get("segments_total")}
    changed = sorted(key for key, value in planned.items() if job.get(key) != value)
    if changed:
        state.clear()
        state.save(fingerprint=_fingerprint(request))
        print(f"{why}; submitted again as job {job['id']}, which plans the text differently "
              f"({', '.join(changed)} changed): starting over", file=log)  # fmt: skip
    else:
        print(f"{why}; submitted again as job {job['id']}", file=log)
    state.save(job_id=job["id"], segments_total=job["segments_total"], plan=_plan(job))
    return job


def _audio_gone(client: TTSClient, job_id: str, error: TTSClientError) -> bool:
    """Say whether ``error``, met fetching a segment of ``job_id``, means the job's audio is no longer kept."""
    if error.status == 410 and error.code == "gone":
        return True
    if error.status != 404:
        return False
    try:  # the segment route's 404 is also its answer for an index past the end
        client.status(job_id)
    except TTSClientError as e:
        return e.status == 404
    return False


def _fetch_missing(
    client: TTSClient, state: BookState, job: dict[str, Any], progress: ProgressBar, log: TextIO
) -> None:
    """Fetch into ``state`` each segment of ``job`` not saved yet, showing progress."""
    job_id, total = job["id"], int(job["segments_total"])
    have = state.have(total)
    rate = int(state.data.get("sample_rate") or 0)
    audio_s = sum(state.segment_path(i).stat().st_size / 2 / rate for i in have) if rate else 0.0
    if have:
        print(f"resuming job {job_id}: {len(have)}/{total} segments already here", file=log)
    progress.update(len(have), total, audio_s)
    done = len(have)
    for index in sorted(set(range(total)) - set(have)):
        pcm, duration, rate = client.segment(job_id, index)
        state.put_segment(index, pcm)
        if state.data.get("sample_rate") != rate:
            state.save(sample_rate=rate)
        done += 1
        audio_s += duration
        progress.update(done, total, audio_s)


def make_book(
    client: TTSClient,
    text: str,
    output: Path,
    *,
    options: dict[str, Any],
    state_file: Path,
    progress: ProgressBar,
    log: TextIO,
) -> Path:
    """Turn ``text`` into ``output``, keeping fetched segments in ``state_file``'s folder so a rerun resumes.

    When the job's audio is no longer kept (its audio TTL passed, or the service's memory budget needed it), the
    text is submitted again and only the segments not saved yet are fetched, from the new job.
    """
    check_supported(output_format(output, None))
    state = BookState(state_file)
    request = {"text": text, "format": "pcm", **options}
    job = _reuse_or_submit(client, state, request, log)
    submitted_again = False
    while True:
        saved = len(state.have(int(job["segments_total"])))
        try:
            _fetch_missing(client, state, job, progress, log)
            break
        except TTSClientError as e:
            # A job submitted again that loses its audio before giving a segment would only loop.
            stuck = submitted_again and len(state.have(int(job["segments_total"]))) == saved
            if stuck or not _audio_gone(client, job["id"], e):
                raise
        progress.close()
        job = _submit_again(client, state, request, log, why=f"job {job['id']}'s audio is no longer kept")
        submitted_again = True
    progress.close()
    total = int(job["segments_total"])
    pcm = b"".join(state.segment_path(i).read_bytes() for i in range(total))
    write_audio(output, pcm, int(state.data["sample_rate"]), output_format(output, None))
    state.clear()
    return output
