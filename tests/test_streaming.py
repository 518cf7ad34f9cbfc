"""Hear it while it is made: server-sent events in order with resume, a growing audio stream, OpenAI speech."""

from __future__ import annotations

import io
import json
import threading
import time
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from flask import Flask
from flask.testing import FlaskClient

from api.streaming import Ended, Ready, follow
from cache.jobstore import JobRequest, JobStore
from tests.support.http import serving

#: A growing stream answers with these headers; a finished job's file with a Content-Disposition instead.
GROWING = "no-store"

FIVE = (
    "One small step. Two birds sing. Three cats sleep on the warm roof. "
    "Four boats sail past the harbour. Five stars shine above the hills."
)


def _events(client: FlaskClient, url: str, **headers: str) -> list[dict[str, Any]]:
    response = client.get(url, headers=headers, buffered=False)
    assert response.status_code == 200
    assert response.mimetype == "text/event-stream"
    events = []
    for block in response.get_data(as_text=True).split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "event" in fields:
            events.append({"id": fields.get("id"), "event": fields["event"], "data": json.loads(fields["data"])})
    return events


def _submit(client: FlaskClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.get_data(as_text=True)
    job: dict[str, Any] = response.get_json()
    return job


def test_events_arrive_one_per_segment_in_order_then_done(served: FlaskClient) -> None:
    job = _submit(served, text=FIVE, model="espeak-en", cache=False)
    events = _events(served, f"/v1/jobs/{job['id']}/events")
    segments = [e for e in events if e["event"] == "segment"]
    assert [e["id"] for e in segments] == [str(i) for i in range(job["segments_total"])]
    assert [e["data"]["index"] for e in segments] == list(range(job["segments_total"]))
    assert all(e["data"]["duration_s"] > 0 for e in segments)
    assert segments[0]["data"]["url"] == f"/v1/jobs/{job['id']}/segments/0"
    assert events[-1]["event"] == "done"


def test_reconnecting_with_last_event_id_resumes_without_gap_or_repeat(served: FlaskClient) -> None:
    job = _submit(served, text=FIVE, model="espeak-en", cache=False)
    _events(served, f"/v1/jobs/{job['id']}/events")
    resumed = _events(served, f"/v1/jobs/{job['id']}/events", **{"Last-Event-ID": "1"})
    assert [e["data"]["index"] for e in resumed if e["event"] == "segment"] == list(range(2, job["segments_total"]))
    assert resumed[-1]["event"] == "done"


def test_a_bad_last_event_id_is_a_422(served: FlaskClient) -> None:
    job = _submit(served, text="Hello.", model="espeak-en")
    for bad in ("abc", "-5", "1.5.2", "1.", "9" * 13):
        response = served.get(f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": bad})
        assert response.status_code == 422
        assert response.get_json()["error"]["field"] == "Last-Event-ID"


def test_segments_that_finish_out_of_order_are_delivered_in_order(redis_client: Any) -> None:
    store = JobStore(redis_client, ttl=60)
    request = JobRequest(model="m", voice="v", speed=1.0, mode="balanced", format="pcm", priority="realtime", seed=None)
    job_id = store.create(request, ["a", "b", "c"])

    def finish_backwards() -> None:
        for index in (2, 1, 0):
            time.sleep(0.05)
            store.write_segment(job_id, index, bytes([index]) * 4, sample_rate=8000, meta={})

    threading.Thread(target=finish_backwards).start()
    seen = [e for e in follow(store, job_id, keepalive_s=1) if not isinstance(e, Ready) or True]
    assert seen == [Ready(0, 3), Ready(1, 3), Ready(2, 3), Ended("done", None)]


def test_a_growing_stream_of_a_done_job_whose_later_audio_is_gone_is_cut_short_not_ended_whole(
    redis_client: Any,
) -> None:
    from api.streaming import CutShort, audio_stream
    from cache import keys

    store = JobStore(redis_client, ttl=60)
    request = JobRequest(model="m", voice="v", speed=1.0, mode="balanced", format="pcm", priority="realtime", seed=None)
    job_id = store.create(request, ["a", "b"])
    for index in (0, 1):
        store.write_segment(job_id, index, bytes([index + 1]) * 4, sample_rate=8000, meta={})
    redis_client.hdel(keys.audio(job_id), "1")  # removed meanwhile: its TTL, or the memory budget
    stream = audio_stream(store, job_id, fmt="pcm", keepalive_s=1)
    assert next(stream) == bytes([1]) * 4
    with pytest.raises(CutShort):
        next(stream)


def test_a_canceled_job_ends_its_event_stream_with_canceled(app: Flask, client: FlaskClient) -> None:
    store = app.extensions["tts"].store
    request = JobRequest(
        model="espeak-en", voice="default", speed=1.0, mode="balanced", format="wav", priority="realtime", seed=None
    )
    job_id = store.create(request, ["never made", "nor this"])
    client.delete(f"/v1/jobs/{job_id}")
    events = _events(client, f"/v1/jobs/{job_id}/events")
    assert events[-1]["event"] == "canceled"


def test_the_growing_stream_has_the_same_bytes_as_the_finished_file(served: FlaskClient) -> None:
    job = _submit(
        served,
        text="今天天气很好。我们去公园散步吧。公园里有很多花。孩子们在草地上玩耍。",
        model="chattts-tiny",
        format="pcm",
        cache=False,
    )
    growing = served.get(f"/v1/jobs/{job['id']}/audio", buffered=False)
    assert growing.status_code == 200
    assert growing.headers["Content-Type"].startswith("audio/L16")
    assert growing.headers["Cache-Control"] == GROWING and "Content-Disposition" not in growing.headers, (
        "the job was still running when the GET began: the stream grew, it was not the finished file"
    )
    streamed = growing.get_data()
    assert served.get(f"/v1/jobs/{job['id']}").get_json()["status"] == "done"
    final = served.get(f"/v1/jobs/{job['id']}/audio")
    assert final.data == streamed


def test_a_growing_wav_stream_plays_the_same_samples_as_the_file(served: FlaskClient) -> None:
    job = _submit(
        served, text="第一句话。第二句话比较长一点。第三句。", model="chattts-tiny", format="wav", cache=False
    )
    growing = served.get(f"/v1/jobs/{job['id']}/audio", buffered=False)
    assert growing.headers["Cache-Control"] == GROWING, "the job was still running when the GET began"
    streamed = growing.get_data()
    final = served.get(f"/v1/jobs/{job['id']}/audio").data
    assert streamed[:4] == b"RIFF"
    assert streamed[44:] == final[44:]


def test_the_official_openai_sdk_gets_audio_from_the_speech_endpoint(app: Flask, worker: object) -> None:
    from openai import OpenAI

    with serving(app) as base_url:
        client = OpenAI(base_url=f"{base_url}/v1", api_key="unused-locally")
        for fmt in ("wav", "mp3", "flac", "opus"):
            response = client.audio.speech.create(
                model="tts-1",
                voice="alloy",
                input="Hello from the speech endpoint. It streams.",
                response_format=fmt,  # type: ignore[arg-type]
            )
            samples, rate = sf.read(io.BytesIO(response.read()))
            assert rate in (22050, 24000)
            assert len(samples) / rate > 0.5, fmt
            assert np.abs(samples).max() > 0.01


def test_the_speech_endpoint_refuses_aac_and_bad_fields(client: FlaskClient) -> None:
    for body, field in [
        ({"input": "hi", "response_format": "aac"}, "response_format"),
        ({"input": ""}, "input"),
        ({"input": "hi", "speed": 5}, "speed"),
    ]:
        response = client.post("/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", **body})
        assert response.status_code == 422
        assert response.get_json()["error"]["field"] == field


def test_a_long_poll_gets_a_segment_written_as_it_ended_its_job(redis_client: Any) -> None:
    """The write that finishes a job can land between the poll's look at the segment and at the status."""
    store = JobStore(redis_client, ttl=60)
    request = JobRequest(model="m", voice="v", speed=1.0, mode="balanced", format="pcm", priority="realtime", seed=None)
    job_id = store.create(request, ["only"])
    look = store.segment
    calls = 0

    def segment_written_just_after_looking(job: str, index: int) -> bytes | None:
        nonlocal calls
        calls += 1
        found = look(job, index)
        if calls == 1:
            store.write_segment(job_id, 0, b"\x01\x02", sample_rate=8000, meta={})  # the job is done now
        return found

    store.segment = segment_written_just_after_looking  # type: ignore[method-assign]
    assert store.wait_segment(job_id, 0, timeout_s=5) == b"\x01\x02"


RATE = 24000


def _tone(index: int, seconds: float = 0.5) -> bytes:
    """Return a segment of 16-bit PCM: a tone of its own pitch, so that each segment is told apart."""
    t = np.arange(int(RATE * seconds)) / RATE
    return (np.sin(2 * np.pi * (220 + 110 * index) * t) * 12000).astype("<i2").tobytes()


def _unfinished_job(app: Flask, fmt: str, segments: int = 3) -> str:
    """Create a job no worker makes (never enqueued), with only its first segment written."""
    store = app.extensions["tts"].store
    request = JobRequest(model="chattts-tiny", voice="default", speed=1.0, mode="balanced", format=fmt,
                         priority="realtime", seed=None, cache=False)  # fmt: skip
    job_id: str = store.create(request, [f"segment {i}" for i in range(segments)])
    store.write_segment(job_id, 0, _tone(0), sample_rate=RATE, meta={"duration_s": 0.5})
    return job_id


@pytest.mark.parametrize("fmt", ["mp3", "opus", "ogg", "wav", "pcm"])
def test_a_running_jobs_audio_grows_as_each_segment_is_written(app: Flask, client: FlaskClient, fmt: str) -> None:
    store = app.extensions["tts"].store
    job_id = _unfinished_job(app, fmt)
    response = client.get(f"/v1/jobs/{job_id}/audio", buffered=False)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.headers["Cache-Control"] == GROWING
    assert client.get(f"/v1/jobs/{job_id}").get_json()["status"] in ("queued", "running"), "unfinished as it is read"
    chunks = iter(response.response)
    before = b""
    while len(before) == 0 or (fmt in ("mp3", "opus", "ogg") and len(before) < 64):
        before += next(chunks)  # segment 0's audio (an encoder may hold back a little of it)
    for index in (1, 2):
        store.write_segment(job_id, index, _tone(index), sample_rate=RATE, meta={"duration_s": 0.5})
    whole = before + b"".join(chunks)
    response.close()
    assert len(whole) > len(before), "the later segments came down the same response"
    if fmt == "pcm":
        assert whole == b"".join(_tone(i) for i in range(3))
        return
    samples, rate = sf.read(io.BytesIO(whole), dtype="float32")
    # Opus decodes at 48 kHz; mp3 and opus add an encoder delay of a few milliseconds.
    assert abs(len(samples) / rate - 1.5) < 0.1, (fmt, len(samples) / rate)
    assert client.get(f"/v1/jobs/{job_id}").get_json()["status"] == "done"


def test_a_running_flac_job_answers_409_not_ready_until_it_is_done(app: Flask, client: FlaskClient) -> None:
    store = app.extensions["tts"].store
    job_id = _unfinished_job(app, "flac", segments=2)
    response = client.get(f"/v1/jobs/{job_id}/audio")
    assert response.status_code == 409
    error = response.get_json()["error"]
    assert error["code"] == "not_ready" and "flac cannot grow" in error["message"]
    assert response.headers["Retry-After"] == "1"
    store.write_segment(job_id, 1, _tone(1), sample_rate=RATE, meta={"duration_s": 0.5})
    done = client.get(f"/v1/jobs/{job_id}/audio")
    assert done.status_code == 200
    samples, rate = sf.read(io.BytesIO(done.data), dtype="int16")
    assert rate == RATE and samples.tobytes() == _tone(0) + _tone(1), "FLAC is lossless"
