"""The voice agents' WebSocket: text pieces in, each segment's audio out, on one connection, under the real
gunicorn (gevent worker) with a real worker."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import soundfile as sf
from simple_websocket import Client, ConnectionClosed

from cache import keys
from devstack.api import ApiProcess
from devstack.worker import WorkerProcess
from tests.support.processes import wait_for


def _connect(api: ApiProcess) -> Client:
    return Client.connect(api.url.replace("http://", "ws://") + "/v1/jobs/stream")


def _receive_until_end(ws: Client, timeout: float = 60) -> tuple[list[dict[str, Any]], list[bytes]]:
    events: list[dict[str, Any]] = []
    frames: list[bytes] = []
    while True:
        message = ws.receive(timeout=timeout)
        assert message is not None, f"nothing for {timeout} s; so far {events}"
        if isinstance(message, bytes):
            frames.append(message)
            continue
        event = json.loads(message)
        events.append(event)
        if event["type"] in ("done", "failed", "canceled", "error"):
            return events, frames


def _close(ws: Client) -> None:
    """Close the client's side. The server may have closed the socket first, after its last event: then the close
    is refused (ConnectionClosed) or, when the client's reader thread shut the socket between the library's check
    and its send, fails on the closed descriptor (OSError: seen once in CI)."""
    with contextlib.suppress(ConnectionClosed, OSError):
        ws.close()


def test_a_voice_socket_takes_text_pieces_and_sends_each_segments_audio_then_done(
    gunicorn_api: ApiProcess, worker: WorkerProcess
) -> None:
    ws = _connect(gunicorn_api)
    try:
        ws.send(json.dumps({"model": "espeak-en", "format": "wav", "cache": False}))
        opened = json.loads(ws.receive(timeout=30))
        assert opened["type"] == "job" and opened["id"]
        for piece in ["Hello the", "re. How are", " you today?"]:
            ws.send(json.dumps({"text": piece}))
        ws.send("And goodbye.")  # bare text is a piece too
        ws.send(json.dumps({"final": True}))
        events, frames = _receive_until_end(ws)
    finally:
        _close(ws)
    segments = [e for e in events if e["type"] == "segment"]
    assert [e["index"] for e in segments] == [0, 1, 2], events
    assert events[-1] == {"type": "done"}
    assert [len(f) for f in frames] == [e["bytes"] for e in segments]
    for frame, event in zip(frames, segments, strict=True):
        samples, rate = sf.read(io.BytesIO(frame), dtype="int16")
        assert rate == 22050
        assert abs(len(samples) / rate - event["duration_s"]) < 1e-3


def test_a_voice_socket_answers_a_bad_opening_message_with_the_http_error_body(
    gunicorn_api: ApiProcess, worker: WorkerProcess
) -> None:
    ws = _connect(gunicorn_api)
    try:
        ws.send(json.dumps({"model": "espeak-en", "speed": 9}))
        events, _ = _receive_until_end(ws, timeout=30)
    finally:
        _close(ws)
    assert events[-1]["type"] == "error" and events[-1]["status"] == 422
    assert events[-1]["error"]["field"] == "speed", events


def test_a_voice_socket_closed_by_its_client_mid_text_cancels_its_job(
    gunicorn_api: ApiProcess, worker: WorkerProcess, redis_client: Any
) -> None:
    ws = _connect(gunicorn_api)
    ws.send(json.dumps({"model": "espeak-en"}))
    job_id = json.loads(ws.receive(timeout=30))["id"]
    ws.send("A sentence nobody will hear")
    ws.close()
    wait_for(lambda: redis_client.hget(keys.job(job_id), "status") == b"canceled", 30,
             "the job of a socket its client closed canceled")  # fmt: skip
