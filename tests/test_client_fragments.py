"""The client's fragments (``TTSClient.fragments``) and ``tts say`` writing them as they come, against a real API
over HTTP: fragments written into a real Redis as a streaming worker writes them, and eSpeak NG end to end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from flask import Flask

from client import TTSClient
from client.cli import main
from client.fragments import Fragment, fragments_of
from tests.test_fragment_streams import LENGTHS, RATE, Maker, app_store, new_job


def _spans(fragments: list[Fragment]) -> list[tuple[int, int, bool]]:
    return [(f.segment, f.number, f.last) for f in fragments]


def _joined(fragments: list[Fragment]) -> dict[int, bytes]:
    joined: dict[int, bytes] = {}
    for fragment in fragments:
        joined[fragment.segment] = joined.get(fragment.segment, b"") + fragment.pcm
    return joined


def test_fragments_yield_a_jobs_audio_in_order_each_once_and_join_to_its_segments(app: Flask, tts: TTSClient) -> None:
    store = app_store(app)
    job_id = new_job(store, 3)
    Maker(store, job_id, LENGTHS).all()
    got = list(tts.fragments(job_id))
    assert _spans(got) == [(0, 0, False), (0, 1, False), (0, 2, True), (1, 0, False), (1, 1, False), (1, 2, False),
                           (1, 3, True), (2, 0, True)]  # fmt: skip
    assert {f.sample_rate for f in got} == {RATE}
    assert _joined(got) == {i: store.segment(job_id, i) for i in range(3)}
    assert _spans(list(tts.fragments(job_id, after="1.1"))) == [(1, 2, False), (1, 3, True), (2, 0, True)]
    assert _spans(list(tts.fragments(job_id, after="1"))) == [(2, 0, True)]


class DroppingSession(requests.Session):
    """Break the first event stream's connection just after the event ``drop_after``; record each Last-Event-ID."""

    def __init__(self, drop_after: str) -> None:
        super().__init__()
        self.marker = f"id: {drop_after}\n".encode()
        self.resumed_after: list[str | None] = []

    def request(self, method: str, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        response = super().request(method, url, *args, **kwargs)
        if urlsplit(str(url)).path.endswith("/events"):
            self.resumed_after.append((kwargs.get("headers") or {}).get("Last-Event-ID"))
            if len(self.resumed_after) == 1:
                whole = response.iter_content
                response.iter_content = lambda chunk_size=None, **_: self._dropped(whole(chunk_size))  # type: ignore[method-assign]
        return response

    def _dropped(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        seen = b""
        for chunk in chunks:
            seen += chunk
            at = seen.find(self.marker)
            end = seen.find(b"\n\n", at) if at >= 0 else -1
            if end >= 0:
                yield seen[: end + 2]
                raise requests.ConnectionError("the connection dropped")
        yield seen


def test_fragments_resume_after_a_dropped_connection_from_the_last_fragment_had(app: Flask, base_url: str) -> None:
    store = app_store(app)
    job_id = new_job(store, 3)
    Maker(store, job_id, LENGTHS).all()
    session = DroppingSession(drop_after="1.1")
    with TTSClient(base_url, session=session) as tts:
        got = list(tts.fragments(job_id))
    assert session.resumed_after == [None, "1.1"], "the stream was followed again from the last event had"
    assert _spans(got) == [(0, 0, False), (0, 1, False), (0, 2, True), (1, 0, False), (1, 1, False), (1, 2, False),
                           (1, 3, True), (2, 0, True)]  # fmt: skip
    assert _joined(got) == {i: store.segment(job_id, i) for i in range(3)}


def test_a_segment_whose_last_fragment_came_before_its_end_is_closed_with_an_empty_last_fragment() -> None:
    events = [
        {
            "event": "fragment",
            "id": "0.0",
            "data": {"index": 0, "fragment": 0, "pcm16": "AQA=", "sample_rate": 8000, "last": False},
        },
        {"event": "segment", "id": "0", "data": {"index": 0}},
        {"event": "segment", "id": "1", "data": {"index": 1}},  # resumed after 1.4, its last
        {"event": "done", "id": None, "data": {"status": "done"}},
    ]
    assert list(fragments_of(events[:2] + events[3:])) == [
        Fragment(0, 0, b"\x01\x00", 8000, False),
        Fragment(0, 1, b"", 8000, True),
    ]
    assert list(fragments_of(events[2:], after="1.4")) == [Fragment(1, 5, b"", 0, True)]


def test_fragments_of_a_failed_job_raise_job_failed() -> None:
    from client import TTSClientError

    events = [{"event": "failed", "id": None, "data": {"status": "failed", "error": "engine broke"}}]
    with pytest.raises(TTSClientError) as failed:
        list(fragments_of(events))
    assert (failed.value.status, failed.value.code) == (409, "job_failed") and "engine broke" in failed.value.message


class JobsSession(requests.Session):
    """Remember the jobs submitted through it."""

    def __init__(self) -> None:
        super().__init__()
        self.job_ids: list[str] = []

    def request(self, method: str, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        response = super().request(method, url, *args, **kwargs)
        if method == "POST" and urlsplit(str(url)).path == "/v1/jobs" and response.status_code == 202:
            self.job_ids.append(response.json()["id"])
        return response


@pytest.mark.parametrize("suffix", ["wav", "pcm"])
def test_say_writes_the_audio_as_it_comes_into_the_file_the_service_sends(
    base_url: str, tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / f"hello.{suffix}"
    session = JobsSession()
    text = "Hello there. This is the command line. It writes as it hears."
    with session:
        assert main(["say", text, "-o", str(out), "--url", base_url, "--model", "espeak-en"], session=session) == 0
        [job_id] = session.job_ids
        whole = session.get(f"{base_url}/v1/jobs/{job_id}/audio", timeout=30)
    assert whole.status_code == 200 and out.read_bytes() == whole.content
    assert not out.with_name(out.name + ".part").exists()
    err = capsys.readouterr().err
    assert "segments" in err and f"wrote {out}" in err


def test_a_streaming_engines_fragments_through_the_client_are_its_whole_audio(base_url: str, tts: TTSClient) -> None:
    job = tts.submit("今天天气很好。我们去公园散步吧。", model="chattts-tiny", format="pcm", cache=False)
    got = list(tts.fragments(job["id"]))
    assert [f.segment for f in got if f.last] == list(range(job["segments_total"]))
    whole = requests.get(f"{base_url}/v1/jobs/{job['id']}/audio", timeout=30)
    assert b"".join(f.pcm for f in got) == whole.content and len(got) > job["segments_total"]
