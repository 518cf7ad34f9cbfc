"""The Python client and the command line against a real API over HTTP and a real worker."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
import redis
import requests
import soundfile as sf

from client import TTSClient, TTSClientError
from client.cli import main
from client.sse import _parse_sse

CHAPTER = (
    "The old lighthouse stood alone on the cliff. Every night its beam swept across the dark water, "
    "warning ships away from the rocks below. The keeper climbed the stairs at dusk and came down again at dawn. "
    "One winter a storm broke the great lamp, and the keeper worked all night by candlelight to mend it. "
    "By morning the light was burning again, and the fishing boats came home safely."
)


class RecordingSession(requests.Session):
    """A session that records each request, and acts like Ctrl-C once ``interrupt_after`` segments came back."""

    def __init__(self, *, interrupt_after: int | None = None) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []
        self.segments_fetched = 0
        self.interrupt_after = interrupt_after

    def request(self, method: str, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        path = urlsplit(str(url)).path
        is_segment = "/segments/" in path
        if is_segment and self.interrupt_after is not None and self.segments_fetched >= self.interrupt_after:
            raise KeyboardInterrupt
        self.calls.append((method, path))
        response = super().request(method, url, *args, **kwargs)
        if is_segment and response.status_code == 200:
            self.segments_fetched += 1
        return response

    def segment_indices(self) -> list[int]:
        """Return the indices of the segments asked for, in order."""
        return [int(path.rsplit("/", 1)[1]) for _, path in self.calls if "/segments/" in path]


def test_a_job_submitted_through_the_client_can_be_waited_for_and_downloaded(tts: TTSClient, tmp_path: Path) -> None:
    job = tts.submit(CHAPTER, model="espeak-en", format="wav", cache=False)
    seen: list[str] = []
    finished = tts.wait(job["id"], on_progress=lambda j: seen.append(j["status"]), poll_s=0.1)
    assert finished["status"] == "done"
    assert seen[-1] == "done"
    progress: list[tuple[int, int | None]] = []
    path = tts.download(job["id"], tmp_path / "chapter.wav", on_progress=lambda n, total: progress.append((n, total)))
    samples, rate = sf.read(path)
    assert rate == 22050
    assert len(samples) / rate > 2
    assert progress[-1] == (path.stat().st_size, path.stat().st_size)
    assert not (tmp_path / "chapter.wav.part").exists()


def test_segments_yields_every_segment_in_order_with_its_duration(tts: TTSClient) -> None:
    job = tts.submit(CHAPTER, model="espeak-en", format="wav", cache=False)
    got = list(tts.segments(job["id"]))
    assert [index for index, _, _ in got] == list(range(job["segments_total"]))
    assert job["segments_total"] >= 3
    for _, audio, duration in got:
        info = sf.info(io.BytesIO(audio))
        assert info.duration == pytest.approx(duration, abs=0.002)
    assert [i for i, _, _ in tts.segments(job["id"], start=2)] == list(range(2, job["segments_total"]))


def test_events_resume_after_last_event_id_without_gap_or_repeat(tts: TTSClient) -> None:
    job = tts.submit(CHAPTER, model="espeak-en", cache=False)
    events = list(tts.events(job["id"]))
    total = job["segments_total"]
    assert [e["data"]["index"] for e in events if e["event"] == "segment"] == list(range(total))
    assert events[-1]["event"] == "done"
    resumed = list(tts.events(job["id"], last_event_id=1))
    assert [e["id"] for e in resumed if e["event"] == "segment"] == [str(i) for i in range(2, total)]
    assert resumed[-1] == {"event": "done", "id": None, "data": {"status": "done"}}


def test_service_errors_become_one_exception_with_status_and_code(tts: TTSClient) -> None:
    with pytest.raises(TTSClientError) as missing:
        tts.status("no-such-job")
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    with pytest.raises(TTSClientError) as invalid:
        tts.submit("Hello.", speed=9)
    assert (invalid.value.status, invalid.value.code) == (422, "invalid_field")
    with TTSClient("http://127.0.0.1:9", timeout=2) as nowhere, pytest.raises(TTSClientError) as down:
        nowhere.status("x")
    assert (down.value.status, down.value.code) == (0, "unreachable")


def test_the_sse_parser_joins_split_chunks_and_skips_comments() -> None:
    stream = [b"retry: 1000\r", b"\n\r\n: keep-alive\n\nid: 3\nevent: seg", b'ment\ndata: {"index": 3}\n', b"\n"]
    stream += [b"event: done\ndata: not json\n\n", b"data: half"]
    assert list(_parse_sse(iter(stream))) == [
        {"event": "segment", "id": "3", "data": {"index": 3}},
        {"event": "done", "id": None, "data": "not json"},
    ]


def test_say_writes_a_playable_wav_and_shows_progress(
    base_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "hello.wav"
    assert main(["say", "Hello there. This is the command line.", "-o", str(out), "--url", base_url]) == 0
    samples, rate = sf.read(out)
    assert rate == 22050
    assert len(samples) / rate > 1
    assert np.abs(samples).max() > 0.01
    err = capsys.readouterr().err
    assert "segments" in err
    assert f"wrote {out}" in err


def _book(base_url: str, text_file: Path, out: Path, session: RecordingSession) -> int:
    with session:
        return main(
            ["book", str(text_file), "-o", str(out), "--url", base_url, "--model", "espeak-en"], session=session
        )


def test_book_shows_progress_and_a_rerun_resumes_the_same_job_fetching_only_missing_segments(
    base_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text_file = tmp_path / "chapter.txt"
    text_file.write_text(CHAPTER, encoding="utf-8")
    out = tmp_path / "chapter.flac"
    part = tmp_path / "chapter.flac.part"

    first = RecordingSession(interrupt_after=2)
    assert _book(base_url, text_file, out, first) == 130
    state = json.loads((part / "job.json").read_text())
    total = state["segments_total"]
    assert total >= 4
    assert sorted(p.name for p in part.glob("seg-*")) == ["seg-00000.pcm", "seg-00001.pcm"]
    assert not out.exists()
    err = capsys.readouterr().err
    assert f"2/{total} segments" in err
    assert "interrupted; run the same command again to resume" in err

    second = RecordingSession()
    assert _book(base_url, text_file, out, second) == 0
    assert not [call for call in second.calls if call[0] == "POST"]
    assert ("GET", f"/v1/jobs/{state['job_id']}") in second.calls
    assert second.segment_indices() == list(range(2, total))
    err = capsys.readouterr().err
    assert f"resuming job {state['job_id']}: 2/{total} segments already here" in err
    assert f"{total}/{total} segments" in err
    assert "s audio" in err
    assert "done in" in err
    assert not part.exists()

    samples, rate = sf.read(out, dtype="int16")
    whole = requests.get(f"{base_url}/v1/jobs/{state['job_id']}/audio", timeout=30)
    assert rate == 22050
    assert np.array_equal(samples, np.frombuffer(whole.content, dtype="<i2"))


def _chapter(folder: Path) -> tuple[Path, Path]:
    """Write the chapter's text into ``folder``; return it and the book's output path beside it."""
    text_file = folder / "chapter.txt"
    text_file.write_text(CHAPTER, encoding="utf-8")
    return text_file, folder / "chapter.wav"


def test_book_submits_again_keeping_the_saved_segments_when_the_interrupted_job_expired(
    base_url: str, tmp_path: Path, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    text_file, out = _chapter(tmp_path)
    assert _book(base_url, text_file, out, RecordingSession(interrupt_after=1)) == 130
    state = json.loads((tmp_path / "chapter.wav.part" / "job.json").read_text())
    old_id = state["job_id"]
    for key in redis_client.scan_iter(match=f"tts:job:{{{old_id}}}:*"):
        redis_client.delete(key)

    again = RecordingSession()
    assert _book(base_url, text_file, out, again) == 0
    assert [call for call in again.calls if call[0] == "POST"] == [("POST", "/v1/jobs")]
    assert again.segment_indices() == list(range(1, state["segments_total"]))
    assert f"job {old_id} is gone from the server (expired); submitted again as job" in capsys.readouterr().err
    assert sf.info(out).samplerate == 22050


def test_book_keeps_the_saved_segments_when_the_interrupted_job_failed(
    base_url: str, tts: TTSClient, tmp_path: Path, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    text_file, out = _chapter(tmp_path)
    assert _book(base_url, text_file, out, RecordingSession(interrupt_after=1)) == 130
    state = json.loads((tmp_path / "chapter.wav.part" / "job.json").read_text())
    _finished(tts, state["job_id"])
    # As a job the store failed to make room ends (its status and reason on its record).
    redis_client.hset(f"tts:job:{{{state['job_id']}}}:record", mapping={"status": "failed", "error": "made room"})
    capsys.readouterr()

    again = RecordingSession()
    assert _book(base_url, text_file, out, again) == 0
    assert again.segment_indices() == list(range(1, state["segments_total"])), "segment 0 was kept, not fetched"
    assert f"job {state['job_id']} failed: made room; submitted again as job" in capsys.readouterr().err


def _finished(tts: TTSClient, job_id: str) -> None:
    deadline = time.monotonic() + 60
    while (job := tts.status(job_id))["status"] not in ("done", "failed", "canceled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job["status"] == "done", job


def _cut_off_book_whose_audio_is_gone(
    base_url: str, tts: TTSClient, redis_client: redis.Redis, text_file: Path, out: Path
) -> dict[str, Any]:
    """Run a book cut off after 2 segments, let its job finish, drop the job's audio; return the saved state."""
    assert _book(base_url, text_file, out, RecordingSession(interrupt_after=2)) == 130
    state: dict[str, Any] = json.loads((out.with_name(out.name + ".part") / "job.json").read_text())
    _finished(tts, state["job_id"])
    assert redis_client.delete(f"tts:job:{{{state['job_id']}}}:audio") == 1  # what its audio TTL does
    with pytest.raises(TTSClientError) as gone:
        tts.segment(state["job_id"], 2)
    assert (gone.value.status, gone.value.code) == (410, "gone")
    return state


def _jobs_of(paths: list[str]) -> list[str]:
    return [path.split("/")[3] for path in paths]


def test_book_resumes_after_the_jobs_audio_is_gone_by_submitting_again_and_keeping_the_saved_segments(
    base_url: str, tts: TTSClient, tmp_path: Path, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    text_file, out = _chapter(tmp_path)
    part = tmp_path / "chapter.wav.part"
    state = _cut_off_book_whose_audio_is_gone(base_url, tts, redis_client, text_file, out)
    old_id, total = state["job_id"], state["segments_total"]
    kept = b"".join((part / f"seg-{i:05d}.pcm").read_bytes() for i in range(2))
    capsys.readouterr()

    again = RecordingSession()
    assert _book(base_url, text_file, out, again) == 0
    assert [call for call in again.calls if call[0] == "POST"] == [("POST", "/v1/jobs")]
    fetched = [path for _, path in again.calls if "/segments/" in path]
    new_id = _jobs_of(fetched)[-1]
    assert new_id != old_id
    # One try of the old job (410), then only the segments not saved yet, from the new job.
    assert fetched == [f"/v1/jobs/{old_id}/segments/2"] + [f"/v1/jobs/{new_id}/segments/{i}" for i in range(2, total)]
    err = capsys.readouterr().err
    assert f"job {old_id}'s audio is no longer kept; submitted again as job {new_id}" in err
    assert f"{total}/{total} segments" in err
    assert not part.exists()

    samples, rate = sf.read(out, dtype="int16")
    rest = b"".join(tts.segment(new_id, i)[0] for i in range(2, total))  # the book's jobs are raw pcm
    assert rate == 22050
    assert np.array_equal(samples, np.frombuffer(kept + rest, dtype="<i2"))


def test_book_starts_over_when_the_job_submitted_again_plans_other_segments(
    base_url: str, tts: TTSClient, tmp_path: Path, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    text_file, out = _chapter(tmp_path)
    state_file = tmp_path / "chapter.wav.part" / "job.json"
    state = _cut_off_book_whose_audio_is_gone(base_url, tts, redis_client, text_file, out)
    total = state["segments_total"]
    # As if the service had cut the text otherwise then (another TTS_SEGMENT_MAX_CHARS, another model version).
    state["plan"]["segments_total"] = state["segments_total"] = total + 1
    state_file.write_text(json.dumps(state), encoding="utf-8")
    capsys.readouterr()

    again = RecordingSession()
    assert _book(base_url, text_file, out, again) == 0
    fetched = [path for _, path in again.calls if "/segments/" in path]
    new_id = _jobs_of(fetched)[-1]
    assert fetched[1:] == [f"/v1/jobs/{new_id}/segments/{i}" for i in range(total)]
    err = capsys.readouterr().err
    assert f"submitted again as job {new_id}, which plans the text differently (segments_total changed)" in err
    samples, _ = sf.read(out, dtype="int16")
    whole = b"".join(tts.segment(new_id, i)[0] for i in range(total))
    assert np.array_equal(samples, np.frombuffer(whole, dtype="<i2"))
