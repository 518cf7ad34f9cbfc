"""Every way out streams fragments: the follower, the event stream and the growing audio, with fragments written
into a real Redis as a worker that streams writes them (and whole segments, as one that cannot)."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis
import soundfile as sf
from flask import Flask
from flask.testing import FlaskClient

from api.streaming import Ended, Fragment, Idle, Position, Ready, follow_fragments
from cache.jobstore import JobRequest, JobStore

RATE = 24000


def tone(segment: int, fragment: int, samples: int) -> bytes:
    """Return 16-bit PCM of its own pitch, so that a fragment out of place changes the audio."""
    t = np.arange(samples) / RATE
    pitch = 220 + 55 * segment + 13 * fragment
    return (np.sin(2 * np.pi * pitch * t) * 9000).astype("<i2").tobytes()


class Maker:
    """Write a job's audio as a worker would: fragments one by one, then the segment holding them all."""

    def __init__(self, store: JobStore, job_id: str, lengths: dict[int, list[int]]) -> None:
        self.store, self.job_id = store, job_id
        self.parts = {i: [tone(i, n, samples) for n, samples in enumerate(cuts)] for i, cuts in lengths.items()}
        self.lengths = lengths

    def fragments(self, index: int, numbers: range) -> None:
        for n in numbers:
            self.store.write_fragment(self.job_id, index, n, self.parts[index][n], sample_rate=RATE)

    def segment(self, index: int, *, with_lengths: bool = True) -> None:
        pcm = b"".join(self.parts[index])
        meta: dict[str, Any] = {"duration_s": len(pcm) / 2 / RATE}
        if with_lengths:
            meta["fragments"] = self.lengths[index]
        self.store.write_segment(self.job_id, index, pcm, sample_rate=RATE, meta=meta)

    def all(self) -> None:
        for index in sorted(self.parts):
            self.fragments(index, range(len(self.parts[index]) - 1))  # the last comes with its segment
            self.segment(index)


def new_job(store: JobStore, segments: int, fmt: str = "pcm") -> str:
    """Create a job that no worker makes (it is never enqueued): the test writes its audio."""
    request = JobRequest(model="chattts-tiny", voice="default", speed=1.0, mode="balanced", format=fmt,
                         priority="realtime", seed=None, cache=False)  # fmt: skip
    job_id: str = store.create(request, [f"segment {i}" for i in range(segments)])
    return job_id


def until(events: Iterator[Any], kind: type) -> list[Any]:
    """Take events up to and including the first of ``kind``; an Idle means the awaited write never came."""
    taken = []
    for event in events:
        assert not isinstance(event, Idle), f"nothing came; so far {taken}"
        taken.append(event)
        if isinstance(event, kind):
            return taken
    raise AssertionError(f"the follower ended before a {kind.__name__}: {taken}")


def joined_by_segment(events: list[Any]) -> dict[int, bytes]:
    joined: dict[int, bytes] = {}
    for event in events:
        if isinstance(event, Fragment):
            joined[event.index] = joined.get(event.index, b"") + event.pcm
    return joined


@pytest.fixture
def store(redis_client: redis.Redis) -> JobStore:
    return JobStore(redis_client, ttl=600)


# --- the follower ------------------------------------------------------------------------------------------


def test_the_follower_yields_each_fragment_once_in_order_as_it_is_written_and_each_segment_joins_to_its_audio(
    store: JobStore,
) -> None:
    job_id = new_job(store, 3)
    maker = Maker(store, job_id, {0: [4800, 7200, 7200, 2400], 1: [4800, 9600], 2: [6000]})
    events = follow_fragments(store, job_id, keepalive_s=2)
    maker.fragments(0, range(1))
    first = until(events, Fragment)
    assert first == [Fragment(0, 0, maker.parts[0][0], RATE, last=False)], "fragment 0 comes before its segment"
    maker.fragments(0, range(1, 3))
    maker.fragments(1, range(2))  # segment 1 is made meanwhile, and written before segment 0
    maker.segment(1)
    middle = [next(events), next(events)]
    assert [(e.index, e.number) for e in middle] == [(0, 1), (0, 2)], "segment 1 waits for segment 0"
    maker.segment(0)  # its last fragment comes only with it
    maker.segment(2, with_lengths=False)  # a cached segment (or eSpeak's): one fragment
    seen = [*first, *middle, *until(events, Ended)]
    fragments = [e for e in seen if isinstance(e, Fragment)]
    assert [(f.index, f.number) for f in fragments] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (2, 0)]
    assert [f.last for f in fragments] == [False, False, False, True, False, True, True]
    assert joined_by_segment(seen) == {i: store.segment(job_id, i) for i in range(3)}
    order = [(type(e).__name__, e.index) for e in seen if isinstance(e, Ready)]
    assert order == [("Ready", 0), ("Ready", 1), ("Ready", 2)] and seen[-1] == Ended("done", None)
    assert seen.index(Ready(0, 3)) == seen.index(fragments[3]) + 1, "a segment's Ready follows its last fragment"


def test_the_follower_resumes_at_the_fragment_after_the_one_named_while_the_segment_is_made_and_after(
    store: JobStore,
) -> None:
    job_id = new_job(store, 2)
    maker = Maker(store, job_id, {0: [2400, 2400, 2400, 2400], 1: [2400, 2400]})
    maker.fragments(0, range(3))
    live = until(follow_fragments(store, job_id, start=Position.after("0.0"), keepalive_s=2), Fragment)
    assert [(f.index, f.number) for f in live] == [(0, 1)]
    maker.segment(0)
    maker.fragments(1, range(1))
    resumed = until(follow_fragments(store, job_id, start=Position.after("0.1"), keepalive_s=2), Ready)
    assert [(f.index, f.number, f.pcm) for f in resumed if isinstance(f, Fragment)] == [
        (0, 2, maker.parts[0][2]),
        (0, 3, maker.parts[0][3]),
    ]
    after_segment = until(follow_fragments(store, job_id, start=Position.after("0"), keepalive_s=2), Fragment)
    assert [(f.index, f.number) for f in after_segment] == [(1, 0)]
    at_the_end = until(follow_fragments(store, job_id, start=Position.after("0.3"), keepalive_s=2), Ready)
    assert at_the_end == [Ready(0, 2)], "after a segment's last fragment, its end is still said"


def test_an_event_id_names_a_segment_or_one_of_its_fragments() -> None:
    assert Position.after("4") == Position(5, 0)
    assert Position.after("4.0") == Position(4, 1)
    assert Position.after("0.17") == Position(0, 18)
    for bad in ("", "-1", "1.", ".5", "1.5.2", "1e3", "a.b", " 1", "1" * 10):
        with pytest.raises(ValueError):
            Position.after(bad)


def test_a_job_canceled_while_a_segment_is_made_ends_the_follow_after_the_fragments_written(store: JobStore) -> None:
    job_id = new_job(store, 2)
    maker = Maker(store, job_id, {0: [2400, 2400, 2400]})
    maker.fragments(0, range(2))
    events = follow_fragments(store, job_id, keepalive_s=2)
    assert [(f.index, f.number) for f in [next(events), next(events)]] == [(0, 0), (0, 1)]
    store.cancel(job_id)
    assert [e.status for e in until(events, Ended)] == ["canceled"]


# --- the event stream --------------------------------------------------------------------------------------


def sse(client: FlaskClient, url: str, **headers: str) -> list[dict[str, Any]]:
    """Return a finished job's events: {"id", "event", "data"} each."""
    response = client.get(url, headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return parse(response.get_data(as_text=True))


def parse(text: str) -> list[dict[str, Any]]:
    events = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "event" in fields:
            events.append({"id": fields.get("id"), "event": fields["event"], "data": json.loads(fields["data"])})
    return events


def pcm_of(event: dict[str, Any]) -> bytes:
    return base64.b64decode(event["data"]["pcm16"])


def app_store(app: Flask) -> JobStore:
    found: JobStore = app.extensions["tts"].store
    return found


LENGTHS = {0: [4800, 7200, 1200], 1: [2400, 2400, 2400, 2400], 2: [9600]}


def test_fragment_events_carry_each_fragment_inline_and_join_to_the_stored_segments(
    app: Flask, client: FlaskClient
) -> None:
    store = app_store(app)
    job_id = new_job(store, 3)
    Maker(store, job_id, LENGTHS).all()
    events = sse(client, f"/v1/jobs/{job_id}/events?fragments=1")
    names = [(e["event"], e["id"]) for e in events]
    assert names == [
        ("fragment", "0.0"), ("fragment", "0.1"), ("fragment", "0.2"), ("segment", "0"),
        ("fragment", "1.0"), ("fragment", "1.1"), ("fragment", "1.2"), ("fragment", "1.3"), ("segment", "1"),
        ("fragment", "2.0"), ("segment", "2"), ("done", None),
    ]  # fmt: skip
    fragments = [e for e in events if e["event"] == "fragment"]
    for index in range(3):
        mine = [e for e in fragments if e["data"]["index"] == index]
        assert b"".join(pcm_of(e) for e in mine) == store.segment(job_id, index)
        assert [e["data"]["fragment"] for e in mine] == list(range(len(LENGTHS[index])))
        assert [e["data"]["last"] for e in mine] == [False] * (len(mine) - 1) + [True]
    first = fragments[0]["data"]
    assert first["samples"] == 4800 and first["sample_rate"] == RATE and first["duration_s"] == 0.2
    segment = next(e for e in events if e["event"] == "segment")
    assert segment["data"]["url"] == f"/v1/jobs/{job_id}/segments/0", "segment events are as they were"


def test_the_event_stream_resumes_mid_segment_at_the_next_fragment_without_repeat_or_gap(
    app: Flask, client: FlaskClient
) -> None:
    store = app_store(app)
    job_id = new_job(store, 3)
    maker = Maker(store, job_id, LENGTHS)
    maker.fragments(0, range(3))
    maker.segment(0)
    maker.fragments(1, range(2))  # segment 1 is being made: two of its fragments are out
    live = client.get(f"/v1/jobs/{job_id}/events?fragments=1", headers={"Last-Event-ID": "0.1"}, buffered=False)
    chunks = iter(live.response)
    heard = ""
    while '"index": 1, "fragment": 1' not in heard:
        heard += next(chunks).decode()
    live.close()  # the listener drops its connection here
    first = parse(heard)
    assert [e["id"] for e in first] == ["0.2", "0", "1.0", "1.1"]
    maker.fragments(1, range(2, 4))
    maker.segment(1)
    maker.segment(2)
    rest = sse(client, f"/v1/jobs/{job_id}/events?fragments=1", **{"Last-Event-ID": first[-1]["id"]})
    assert [e["id"] for e in rest] == ["1.2", "1.3", "1", "2.0", "2", None]
    heard_1 = [pcm_of(e) for e in first + rest if e["event"] == "fragment" and e["data"]["index"] == 1]
    assert b"".join(heard_1) == store.segment(job_id, 1)
    after_segment = sse(client, f"/v1/jobs/{job_id}/events?fragments=1&last_event_id=1")
    assert [e["id"] for e in after_segment] == ["2.0", "2", None]


def test_without_fragments_asked_the_event_stream_is_segments_only_and_resumes_by_either_id(
    app: Flask, client: FlaskClient
) -> None:
    store = app_store(app)
    job_id = new_job(store, 3)
    Maker(store, job_id, LENGTHS).all()
    for query in ("", "?fragments=0", "?fragments=false"):
        assert [e["id"] for e in sse(client, f"/v1/jobs/{job_id}/events{query}")] == ["0", "1", "2", None]
    assert [e["id"] for e in sse(client, f"/v1/jobs/{job_id}/events", **{"Last-Event-ID": "1.2"})] == ["1", "2", None]
    response = client.get(f"/v1/jobs/{job_id}/events?fragments=yes")
    assert response.status_code == 422 and response.get_json()["error"]["field"] == "fragments"


# --- the growing audio -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3", "opus", "ogg"])
def test_a_growing_audio_stream_sends_fragments_as_they_come_and_is_the_file_it_was(
    app: Flask, client: FlaskClient, fmt: str
) -> None:
    store = app_store(app)
    job_id = new_job(store, 2, fmt)
    maker = Maker(store, job_id, {0: [4800, 4800, 2400], 1: [7200, 2400]})
    maker.fragments(0, range(1))  # the stream starts at the first fragment, not the first segment
    response = client.get(f"/v1/jobs/{job_id}/audio", buffered=False)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.headers["Cache-Control"] == "no-store" and response.headers["X-Sample-Rate"] == str(RATE)
    chunks = iter(response.response)
    head = b""
    if fmt in ("pcm", "wav"):
        while len(head) < len(maker.parts[0][0]):
            head += next(chunks)
        assert head.endswith(maker.parts[0][0]), "fragment 0 went out before its segment was written"
    maker.fragments(0, range(1, 2))
    maker.segment(0)
    maker.fragments(1, range(1))
    maker.segment(1)
    streamed = head + b"".join(chunks)
    response.close()
    finished = client.get(f"/v1/jobs/{job_id}/audio").data  # the whole file, encoded segment by segment
    if fmt in ("pcm", "mp3"):
        assert streamed == finished
    elif fmt == "wav":
        assert streamed[44:] == finished[44:] == store.segment(job_id, 0) + store.segment(job_id, 1)
    else:  # an Ogg stream's serial number is drawn anew for each file: the same audio, not the same bytes
        assert decoded(streamed) == decoded(finished)


def decoded(data: bytes) -> bytes:
    samples, _ = sf.read(io.BytesIO(data), dtype="int16")
    return bytes(samples.tobytes())


# --- OpenAI's speech endpoint ------------------------------------------------------------------------------


def test_the_speech_stream_sends_its_first_fragment_before_its_segment_and_joins_to_the_stored_audio(
    app: Flask, client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = app_store(app)
    made: list[Maker] = []

    def submitted_with_its_first_fragment_written(job_input: Any, **_: Any) -> str:
        """Stand in for submission: the job is made here, by the test, not by a worker."""
        job_id = new_job(store, 2)
        made.append(Maker(store, job_id, {0: [4800, 4800, 2400], 1: [7200, 2400]}))
        made[0].fragments(0, range(1))
        return job_id

    monkeypatch.setattr("api.speech.submit_input", submitted_with_its_first_fragment_written)
    body = {"model": "tts-1", "voice": "alloy", "input": "Two sentences. Here.", "response_format": "pcm"}
    response = client.post("/v1/audio/speech", json=body, buffered=False)
    assert response.status_code == 200, response.get_data(as_text=True)
    maker = made[0]
    chunks = iter(response.response)
    head = b""
    while len(head) < len(maker.parts[0][0]):
        head += next(chunks)
    assert head == maker.parts[0][0], "fragment 0 went out before segment 0 was written"
    maker.fragments(0, range(1, 2))
    maker.segment(0)
    maker.segment(1)
    whole = head + b"".join(chunks)
    response.close()
    job_id = response.headers["X-Job-Id"]
    assert whole == store.segment(job_id, 0) + store.segment(job_id, 1)


# --- the voice socket --------------------------------------------------------------------------------------


class Recorder:
    """A WebSocket's sending side that keeps what is sent: JSON events and binary frames, in order."""

    def __init__(self) -> None:
        self.sent: list[str | bytes] = []

    def send(self, data: str | bytes) -> None:
        self.sent.append(data)


def socket_audio(sent: list[str | bytes]) -> list[tuple[dict[str, Any], bytes | None]]:
    """Pair each event with the binary frame its ``bytes`` announces (None: it announces none)."""
    paired: list[tuple[dict[str, Any], bytes | None]] = []
    frames = iter(sent)
    for message in frames:
        assert isinstance(message, str), "a binary frame that no event announced"
        event = json.loads(message)
        frame = next(frames) if "bytes" in event else None
        assert frame is None or (isinstance(frame, bytes) and len(frame) == event["bytes"]), event
        paired.append((event, frame))
    return paired


@pytest.mark.parametrize(("fmt", "encoding"), [("wav", "wav"), ("flac", "flac"), ("pcm", "pcm16"), ("mp3", "pcm16")])
def test_the_voice_socket_sends_each_fragment_in_a_format_it_can_be_cut_in_and_they_join_to_each_segment(
    app: Flask, client: FlaskClient, fmt: str, encoding: str
) -> None:
    from api.voice_socket import _follow, _Socket

    store = app_store(app)
    job_id = new_job(store, 3, fmt)
    Maker(store, job_id, LENGTHS).all()
    recorder = Recorder()
    svc = app.extensions["tts"]
    _follow(svc, job_id, _Socket(recorder, svc.replication.confirm_noted), fragments=True)  # type: ignore[arg-type]
    paired = socket_audio(recorder.sent)
    kinds = [(event["type"], event.get("index"), event.get("fragment")) for event, _ in paired]
    assert kinds == [
        ("fragment", 0, 0), ("fragment", 0, 1), ("fragment", 0, 2), ("segment", 0, None),
        ("fragment", 1, 0), ("fragment", 1, 1), ("fragment", 1, 2), ("fragment", 1, 3), ("segment", 1, None),
        ("fragment", 2, 0), ("segment", 2, None), ("done", None, None),
    ]  # fmt: skip
    for index in range(3):
        mine = [(event, frame) for event, frame in paired if event["type"] == "fragment" and event["index"] == index]
        assert {event["encoding"] for event, _ in mine} == {encoding}
        assert [event["last"] for event, _ in mine] == [False] * (len(mine) - 1) + [True]
        pcm = b"".join(frame if encoding == "pcm16" else decoded(frame) for _, frame in mine if frame is not None)
        assert pcm == store.segment(job_id, index)
    segment = next(event for event, _ in paired if event["type"] == "segment")
    assert segment == {"type": "segment", "index": 0, "duration_s": 0.55, "fragments": 3}


def test_without_fragments_the_voice_socket_sends_each_segment_whole_as_before(app: Flask, client: FlaskClient) -> None:
    from api.voice_socket import _follow, _Socket

    store = app_store(app)
    job_id = new_job(store, 3, "wav")
    Maker(store, job_id, LENGTHS).all()
    recorder = Recorder()
    svc = app.extensions["tts"]
    _follow(svc, job_id, _Socket(recorder, svc.replication.confirm_noted))  # type: ignore[arg-type]
    paired = socket_audio(recorder.sent)
    assert [event["type"] for event, _ in paired] == ["segment", "segment", "segment", "done"]
    for index, (event, frame) in enumerate(paired[:3]):
        assert set(event) == {"type", "index", "duration_s", "bytes"} and event["index"] == index
        assert frame is not None and decoded(frame) == store.segment(job_id, index)


# --- end to end with eSpeak NG, which cannot stream: one fragment per segment ------------------------------

FIVE = (
    "One small step. Two birds sing. Three cats sleep on the warm roof. "
    "Four boats sail past the harbour. Five stars shine above the hills."
)


def test_espeak_jobs_events_give_one_fragment_per_segment_each_its_whole_audio(app: Flask, served: FlaskClient) -> None:
    job = served.post("/v1/jobs", json={"text": FIVE, "model": "espeak-en", "format": "pcm", "cache": False})
    job_id, total = job.get_json()["id"], job.get_json()["segments_total"]
    events = sse(served, f"/v1/jobs/{job_id}/events?fragments=1")
    assert [e["id"] for e in events] == [id_ for i in range(total) for id_ in (f"{i}.0", f"{i}")] + [None]
    store = app_store(app)
    for event in (e for e in events if e["event"] == "fragment"):
        assert event["data"]["last"] and event["data"]["sample_rate"] == 22050
        assert pcm_of(event) == store.segment(job_id, event["data"]["index"])


def test_espeaks_speech_stream_is_its_stored_segments_joined(app: Flask, served: FlaskClient) -> None:
    body = {"model": "espeak-en", "voice": "alloy", "input": FIVE, "response_format": "pcm"}
    response = served.post("/v1/audio/speech", json=body)
    assert response.status_code == 200, response.get_data(as_text=True)
    job_id = response.headers["X-Job-Id"]
    store = app_store(app)
    total = store.get(job_id).segments_total  # type: ignore[union-attr]
    assert total == 5 and response.data == b"".join(store.segment(job_id, i) or b"" for i in range(total))


# --- end to end with the tiny ChatTTS, which streams: fragments as its worker writes them ------------------


def test_a_streaming_engines_fragments_arrive_in_order_and_join_to_each_segment_end_to_end(
    app: Flask, served: FlaskClient
) -> None:
    body = {"text": "今天天气很好。我们去公园散步吧。", "model": "chattts-tiny", "format": "pcm", "cache": False}
    job = served.post("/v1/jobs", json=body).get_json()
    events = sse(served, f"/v1/jobs/{job['id']}/events?fragments=1")
    assert events[-1]["event"] == "done", events[-1]
    store = app_store(app)
    fragments = [e for e in events if e["event"] == "fragment"]
    for index in range(job["segments_total"]):
        mine = [e for e in fragments if e["data"]["index"] == index]
        assert [e["data"]["fragment"] for e in mine] == list(range(len(mine)))
        assert b"".join(pcm_of(e) for e in mine) == store.segment(job["id"], index)
        ends = [i for i, e in enumerate(events) if e["id"] == str(index)]
        assert ends and events[ends[0] - 1]["id"] == f"{index}.{len(mine) - 1}", "its end follows its last fragment"
    assert len(fragments) > job["segments_total"], "the tiny ChatTTS makes its segments in several fragments"
