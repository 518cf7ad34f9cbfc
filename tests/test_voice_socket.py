"""The voice agents' WebSocket: text pieces in, each segment's audio out, on one connection, under the real
gunicorn (gevent worker) with a real worker."""

from __future__ import annotations

import io
import json
from typing import Any

import soundfile as sf
from simple_websocket import Client

from cache import keys
from cache.jobstore import JobStore
from devstack.api import ApiProcess
from devstack.worker import WorkerProcess
from tests.support.processes import wait_for
from tests.support.sockets import close, connect, receive_until_end


def test_a_voice_socket_takes_text_pieces_and_sends_each_segments_audio_then_done(
    gunicorn_api: ApiProcess, worker: WorkerProcess
) -> None:
    ws = connect(gunicorn_api)
    try:
        ws.send(json.dumps({"model": "espeak-en", "format": "wav", "cache": False}))
        opened = json.loads(ws.receive(timeout=30))
        assert opened["type"] == "job" and opened["id"]
        for piece in ["Hello the", "re. How are", " you today?"]:
            ws.send(json.dumps({"text": piece}))
        ws.send("And goodbye.")  # bare text is a piece too
        ws.send(json.dumps({"final": True}))
        events, frames = receive_until_end(ws)
    finally:
        close(ws)
    segments = [e for e in events if e["type"] == "segment"]
    assert [e["index"] for e in segments] == [0, 1, 2], events
    assert events[-1] == {"type": "done"}
    assert [len(f) for f in frames] == [e["bytes"] for e in segments]
    for frame, event in zip(frames, segments, strict=True):
        samples, rate = sf.read(io.BytesIO(frame), dtype="int16")
        assert rate == 22050
        assert abs(len(samples) / rate - event["duration_s"]) < 1e-3


def test_a_voice_socket_asked_for_fragments_sends_espeaks_segments_as_one_fragment_each_then_their_ends(
    gunicorn_api: ApiProcess, worker: WorkerProcess, redis_client: Any
) -> None:
    ws = Client.connect(gunicorn_api.url.replace("http://", "ws://") + "/v1/jobs/stream?fragments=1")
    try:
        ws.send(json.dumps({"model": "espeak-en", "format": "wav", "cache": False}))
        job_id = json.loads(ws.receive(timeout=30))["id"]
        ws.send(json.dumps({"text": "Hello there. How are you today?", "final": True}))
        events, frames = receive_until_end(ws)
    finally:
        close(ws)
    audio = [e for e in events if e["type"] in ("fragment", "segment")]
    assert [(e["type"], e["index"]) for e in audio] == [("fragment", 0), ("segment", 0), ("fragment", 1),
                                                        ("segment", 1)], events  # fmt: skip
    fragments = [e for e in audio if e["type"] == "fragment"]
    assert all(e["fragment"] == 0 and e["last"] and e["encoding"] == "wav" for e in fragments), fragments
    assert [e["fragments"] for e in audio if e["type"] == "segment"] == [1, 1]
    assert [len(f) for f in frames] == [e["bytes"] for e in fragments]
    store = JobStore(redis_client, ttl=60)
    for index, frame in enumerate(frames):
        samples, rate = sf.read(io.BytesIO(frame), dtype="int16")
        assert rate == 22050 and samples.tobytes() == store.segment(job_id, index)


def test_a_voice_socket_answers_a_bad_opening_message_with_the_http_error_body(
    gunicorn_api: ApiProcess, worker: WorkerProcess
) -> None:
    ws = connect(gunicorn_api)
    try:
        ws.send(json.dumps({"model": "espeak-en", "speed": 9}))
        events, _ = receive_until_end(ws, timeout=30)
    finally:
        close(ws)
    assert events[-1]["type"] == "error" and events[-1]["status"] == 422
    assert events[-1]["error"]["field"] == "speed", events


def test_an_opening_message_that_is_not_a_json_object_is_refused_not_spoken(
    gunicorn_api: ApiProcess, worker: WorkerProcess
) -> None:
    """Before, a job opened on the default model and read the malformed JSON aloud."""
    for opening in ('{"model": "espeak-en", "format": "wav"', "[1, 2, 3]", "Hello there.", b"\x00\x01"):
        ws = connect(gunicorn_api)
        try:
            ws.send(opening)
            events, _ = receive_until_end(ws, timeout=30)
        finally:
            close(ws)
        assert [e["type"] for e in events] == ["error"], (opening, events)
        message = events[0]["error"]["message"]
        assert events[0]["status"] == 400 and ("JSON object" in message or "binary" in message), (opening, events)


def test_a_piece_that_starts_as_a_json_object_but_is_not_one_is_refused_and_the_job_canceled(
    gunicorn_api: ApiProcess, worker: WorkerProcess, redis_client: Any
) -> None:
    ws, job_id = _opened(gunicorn_api)
    try:
        ws.send('{"text": "Hello.", "final": tru}')
        events, _ = receive_until_end(ws, timeout=30)
    finally:
        close(ws)
    assert events[-1]["type"] == "error" and "not valid JSON" in events[-1]["error"]["message"], events
    assert _ended_status(redis_client, job_id, timeout=10) == "canceled"


def test_a_voice_socket_closed_by_its_client_mid_text_cancels_its_job(
    gunicorn_api: ApiProcess, worker: WorkerProcess, redis_client: Any
) -> None:
    ws = connect(gunicorn_api)
    ws.send(json.dumps({"model": "espeak-en"}))
    job_id = json.loads(ws.receive(timeout=30))["id"]
    ws.send("A sentence nobody will hear")
    ws.close()
    wait_for(lambda: redis_client.hget(keys.job(job_id), "status") == b"canceled", 30,
             "the job of a socket its client closed canceled")  # fmt: skip


def _opened(api: ApiProcess, **fields: Any) -> tuple[Client, str]:
    """Open a voice socket's job (espeak, uncached) and return the connection and the job's id."""
    ws = connect(api)
    ws.send(json.dumps({"model": "espeak-en", "cache": False, **fields}))
    opened = json.loads(ws.receive(timeout=30))
    assert opened["type"] == "job", opened
    return ws, opened["id"]


def _ended_status(redis_client: Any, job_id: str, timeout: float = 30) -> str:
    """Wait for the job to end and return how (done, failed or canceled)."""

    def ended() -> str | None:
        status = (redis_client.hget(keys.job(job_id), "status") or b"").decode()
        return status if status in ("done", "failed", "canceled") else None

    return wait_for(ended, timeout, f"job {job_id} ended")


#: Enough sentences that espeak is still making them seconds after the first one arrives.
MANY_SENTENCES = " ".join(f"Sentence number {i} is spoken for nobody at all." for i in range(60))


def test_a_lone_surrogate_in_a_piece_is_answered_with_an_error_event_not_a_crash(
    gunicorn_api: ApiProcess, worker: WorkerProcess, redis_client: Any
) -> None:
    ws, job_id = _opened(gunicorn_api)
    try:
        ws.send('{"text": "\\ud800 ok. "}')  # json.loads takes the escape; UTF-8 cannot carry what it makes
        events, _ = receive_until_end(ws, timeout=30)
    finally:
        close(ws)
    assert events[-1]["type"] == "error" and events[-1]["status"] == 400, events
    assert "lone surrogate" in events[-1]["error"]["message"], events
    assert _ended_status(redis_client, job_id) == "canceled"  # as after any bad message: the connection is over


def test_a_lone_surrogate_in_the_opening_message_is_answered_with_an_error_event(
    gunicorn_api: ApiProcess, worker: WorkerProcess
) -> None:
    ws = connect(gunicorn_api)
    try:
        ws.send('{"model": "espeak-en", "text": "Hello \\udc00 there."}')
        events, _ = receive_until_end(ws, timeout=30)
    finally:
        close(ws)
    assert [e["type"] for e in events] == ["error"], events
    assert events[0]["status"] == 400 and "lone surrogate" in events[0]["error"]["message"], events


def test_a_final_that_is_not_a_boolean_is_answered_with_an_error_event_naming_it(
    gunicorn_api: ApiProcess, worker: WorkerProcess, redis_client: Any
) -> None:
    ws, job_id = _opened(gunicorn_api)
    try:
        ws.send(json.dumps({"text": "Hi there.", "final": "true"}))
        events, _ = receive_until_end(ws, timeout=10)  # not taken as final, the stream would idle for 30 s
    finally:
        close(ws)
    assert events[-1]["type"] == "error" and events[-1]["status"] == 422, events
    assert events[-1]["error"]["field"] == "final", events
    assert _ended_status(redis_client, job_id) == "canceled"


def test_a_bad_message_mid_text_cancels_the_job_it_leaves_unfinished(
    gunicorn_api: ApiProcess, worker: WorkerProcess, redis_client: Any
) -> None:
    ws, job_id = _opened(gunicorn_api)
    try:
        ws.send(json.dumps({"text": MANY_SENTENCES}))
        ws.send(json.dumps({"text": 5}))
        events, _ = receive_until_end(ws, timeout=30)
    finally:
        close(ws)
    assert events[-1]["type"] == "error" and events[-1]["error"]["field"] == "text", events
    # Before, the stream stayed open until its idle end (30 s) and then spoke everything to nobody.
    assert _ended_status(redis_client, job_id, timeout=10) == "canceled"


def test_hanging_up_after_the_final_piece_cancels_the_job_still_being_made(
    gunicorn_api: ApiProcess, worker: WorkerProcess, redis_client: Any
) -> None:
    ws, job_id = _opened(gunicorn_api)
    try:
        ws.send(json.dumps({"text": MANY_SENTENCES, "final": True}))
        planned = heard = False  # "planned" once the final piece is taken; audio once the job is being made
        while not (planned and heard):
            message = ws.receive(timeout=30)
            assert message is not None, f"nothing for 30 s (planned: {planned}, audio: {heard})"
            heard = heard or isinstance(message, bytes)
            planned = planned or (isinstance(message, str) and json.loads(message)["type"] == "planned")
    finally:
        close(ws)  # barge-in: the listener stops the speech
    assert _ended_status(redis_client, job_id) == "canceled"
    made = int(redis_client.hget(keys.job(job_id), "segments_done") or 0)
    total = int(redis_client.hget(keys.job(job_id), "segments_total") or 0)
    assert made < total, f"all {total} segments were made for nobody"


def test_a_client_that_reads_slower_than_its_audio_comes_gets_every_frame_whole(
    gunicorn_api: ApiProcess, worker: WorkerProcess
) -> None:
    """The server's sends fill its buffers and wait: a frame is never cut short (the stream then misread)."""
    import socket
    import time

    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, BytesMessage, Message, Request, TextMessage

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window stays small
    sock.settimeout(60)
    sock.connect(("127.0.0.1", gunicorn_api.port))
    client = WSConnection(ConnectionType.CLIENT)
    sock.sendall(client.send(Request(host="test", target="/v1/jobs/stream")))
    text = " ".join(f"Sentence number {i} is here, and it is long enough to take a while." for i in range(50))
    opened = False
    events: list[dict[str, Any]] = []
    frames: list[bytes] = []
    part_text, part_bytes = "", b""
    while not events or events[-1]["type"] not in ("done", "failed", "canceled", "error"):
        data = sock.recv(2048)
        assert data, f"the server closed the connection; so far {events[-3:]}"
        client.receive_data(data)
        for event in client.events():
            if isinstance(event, AcceptConnection) and not opened:
                opened = True
                for message in ('{"model": "espeak-en", "format": "wav"}', text, '{"final": true}'):
                    sock.sendall(client.send(Message(data=message)))
            elif isinstance(event, TextMessage):  # wsproto hands a message over in parts as they arrive
                part_text += event.data
                if event.message_finished:
                    events.append(json.loads(part_text))  # a frame misread as text would not parse
                    part_text = ""
            elif isinstance(event, BytesMessage):
                part_bytes += event.data
                if event.message_finished:
                    frames.append(part_bytes)
                    part_bytes = b""
            else:
                assert not hasattr(event, "code") or (events[-1:] and events[-1]["type"] == "done"), event
        time.sleep(0.004)  # about 500 KB/s: slower than the audio comes
    sock.close()
    segments = [e for e in events if e["type"] == "segment"]
    assert events[-1]["type"] == "done" and len(segments) == len(frames) >= 50
    assert [len(f) for f in frames] == [e["bytes"] for e in segments]
    assert all(f.startswith(b"RIFF") for f in frames)
