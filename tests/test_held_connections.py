"""Held connections (event streams, long-polls, downloads) neither starve the API nor hold the whole file.

The real-server tests run `make run`'s gunicorn command (gevent, two processes, shared metrics folder) against
the session's Redis; the rest use the Flask test client.
"""

from __future__ import annotations

import io
import json
import math
import socket
import threading
import tracemalloc
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import numpy as np
import pytest
import redis
import requests
import soundfile as sf
from flask import Flask

from cache import keys
from cache.events import EventHub
from cache.jobstore import JobRequest, JobStore
from cache.streams import CallerStreams
from core.audio import MEDIA_TYPES
from tests.conftest import GUNICORN_KEEPALIVE_S, GUNICORN_STREAMS_PER_CALLER
from tests.support.processes import wait_for
from tests.support.servers import ApiProcess, RedisServer, WorkerProcess

RATE = 24000
SEGMENT_SAMPLES = RATE // 2


def _request(fmt: str = "wav", *, cache: bool = False) -> JobRequest:
    return JobRequest(
        model="espeak-en", voice="default", speed=1.0, mode="balanced", format=fmt, priority="batch", seed=None,
        cache=cache,
    )  # fmt: skip


def _held_job(store: JobStore, segments: int = 3) -> str:
    """Create a job whose segments all wait in its pending list: nothing makes them, so its streams stay open."""
    return store.create(_request(), ["never made"] * segments, pending=list(range(segments)))


def _tone(index: int, samples: int = SEGMENT_SAMPLES) -> bytes:
    """Return a segment of speech-like audio: two tones that differ from segment to segment."""
    t = np.arange(samples) / RATE
    wave = 0.3 * np.sin(2 * np.pi * (180 + 17 * index) * t) + 0.15 * np.sin(2 * np.pi * (700 + 31 * index) * t)
    return (wave * 32767).astype("<i2").tobytes()


def _stalled_job(store: JobStore) -> str:
    """Create a job whose segment 0 is made and whose segment 1 never will be: its audio stream waits, idle."""
    job_id = store.create(_request(), ["made", "never made"], pending=[1])
    store.write_segment(job_id, 0, _tone(0), sample_rate=RATE, meta={"duration_s": round(SEGMENT_SAMPLES / RATE, 4)})
    return job_id


def _finished_job(store: JobStore, fmt: str, segments: int, samples: int = SEGMENT_SAMPLES) -> str:
    job_id = store.create(_request(fmt), [f"segment {i}" for i in range(segments)])
    for index in range(segments):
        meta = {"duration_s": round(samples / RATE, 4)}
        store.write_segment(job_id, index, _tone(index, samples), sample_rate=RATE, meta=meta)
    record = store.get(job_id)
    assert record is not None and record.status == "done"
    return job_id


class RawStream:
    """An HTTP/1.1 GET on a socket of its own, from a chosen loopback address (which names its caller)."""

    def __init__(self, port: int, path: str, *, source: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15, source_address=(source, 0))
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\nAccept: */*\r\n\r\n".encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buffer += data

    def until(self, marker: bytes) -> bytes:
        """Read until ``marker`` has arrived; return everything read so far."""
        while marker not in self.buffer:
            self._read()
        return self.buffer

    def json_body(self) -> dict[str, Any]:
        """Read a body of known length as JSON."""
        length = int(self.headers["content-length"])
        while len(self.buffer) < length:
            self._read()
        found: dict[str, Any] = json.loads(self.buffer[:length])
        return found

    def close(self) -> None:
        """Leave, as a client that goes away does."""
        self.sock.close()


def _first_voice_message(port: int, source: str) -> dict[str, Any]:
    """Open a voice socket from ``source`` with an opening message; return the server's first message."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Message, Request, TextMessage

    with socket.create_connection(("127.0.0.1", port), timeout=15, source_address=(source, 0)) as sock:
        client = WSConnection(ConnectionType.CLIENT)
        sock.sendall(client.send(Request(host="test", target="/v1/jobs/stream")))
        text = ""
        while True:
            client.receive_data(sock.recv(65536))
            for event in client.events():
                if isinstance(event, AcceptConnection):
                    sock.sendall(client.send(Message(data='{"model": "espeak-en"}')))
                elif isinstance(event, TextMessage):
                    text += event.data
                    if event.message_finished:
                        found: dict[str, Any] = json.loads(text)
                        return found


def _open_events(server: ApiProcess, job_id: str, source: str) -> RawStream:
    stream = RawStream(server.port, f"/v1/jobs/{job_id}/events", source=source)
    if stream.status == 200:
        stream.until(b"retry: 1000")  # the stream is open and its first event went out
    return stream


def _slots(client: redis.Redis, source: str) -> int:
    return int(client.zcard(keys.streams(f"ip-{source}")))


# --- the real server ---------------------------------------------------------------------------------------


def test_events_stream_end_to_end_under_the_make_run_gunicorn(
    gunicorn_api: ApiProcess, worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    text = "One small step. Two birds sing. Three cats sleep on the warm roof."
    with requests.Session() as session:
        job = session.post(f"{gunicorn_api.url}/v1/jobs", json={"text": text, "cache": False}, timeout=30).json()
        names, ids = [], []
        with session.get(f"{gunicorn_api.url}/v1/jobs/{job['id']}/events", stream=True, timeout=60) as response:
            assert response.status_code == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            for raw in response.iter_lines():
                line = raw.decode()
                if line.startswith("id: "):
                    ids.append(int(line[4:]))
                elif line.startswith("event: "):
                    names.append(line[7:])
                    if names[-1] != "segment":
                        break
    assert ids == list(range(job["segments_total"]))
    assert names == ["segment"] * job["segments_total"] + ["done"]


def test_metrics_are_served_for_every_gunicorn_process_through_the_shared_folder(gunicorn_api: ApiProcess) -> None:
    for _ in range(4):
        assert requests.get(f"{gunicorn_api.url}/healthz", timeout=10).status_code == 200
    response = requests.get(f"{gunicorn_api.url}/metrics", timeout=10)
    assert response.status_code == 200
    assert 'tts_http_requests_total{method="GET",route="/healthz",status="200"}' in response.text


def test_healthz_answers_while_200_event_streams_are_held_open(
    gunicorn_api: ApiProcess, redis_client: redis.Redis
) -> None:
    store = JobStore(redis_client, ttl=600)
    jobs = [_held_job(store) for _ in range(4)]
    callers = [f"127.0.0.{10 + n}" for n in range(200 // GUNICORN_STREAMS_PER_CALLER)]
    with ExitStack() as held:
        for n in range(200):
            stream = _open_events(gunicorn_api, jobs[n % len(jobs)], callers[n % len(callers)])
            held.callback(stream.close)
            assert stream.status == 200
        assert sum(_slots(redis_client, caller) for caller in callers) == 200
        answer = requests.get(f"{gunicorn_api.url}/healthz", timeout=10)
        assert answer.status_code == 200
        assert answer.json() == {"status": "ok"}
        # The 200 waits share one blocked XREAD per API process, not one connection each.
        blocked = [len(_blocked(redis_client)) for _ in range(20)]
        assert max(blocked) <= gunicorn_api.processes, blocked
        wait_for(lambda: _blocked(redis_client), 10, "the streams' waits blocked in XREAD")
    wait_for(lambda: not any(_slots(redis_client, c) for c in callers), 30, "every caller's slots given back")


def test_a_caller_over_its_stream_limit_gets_429_naming_the_limit_until_a_stream_closes(
    gunicorn_api: ApiProcess, redis_client: redis.Redis
) -> None:
    store = JobStore(redis_client, ttl=600)
    job_id = _held_job(store)
    caller = "127.0.0.77"
    streams = [_open_events(gunicorn_api, job_id, caller) for _ in range(GUNICORN_STREAMS_PER_CALLER)]
    try:
        assert [s.status for s in streams] == [200] * GUNICORN_STREAMS_PER_CALLER
        refused = _open_events(gunicorn_api, job_id, caller)
        assert refused.status == 429
        # Told to wait two keep-alives: by then, a stream whose client left is noticed and its slot freed.
        assert int(refused.headers["retry-after"]) == math.ceil(2 * GUNICORN_KEEPALIVE_S)
        error = refused.json_body()["error"]
        assert error["code"] == "too_many_requests"
        assert error["limit"] == "max_streams_per_caller"
        assert error["max"] == GUNICORN_STREAMS_PER_CALLER
        assert "max_streams_per_caller" in error["message"]
        refused.close()
        long_poll = RawStream(gunicorn_api.port, f"/v1/jobs/{job_id}/segments/0?wait=5", source=caller)
        assert long_poll.status == 429  # a long-poll is held too
        long_poll.close()
        voice = _first_voice_message(gunicorn_api.port, caller)  # and a voice socket: no header, so in the event
        assert (voice["type"], voice["status"], voice["error"]["code"]) == ("error", 429, "too_many_requests")
        assert voice["retry_after"] > 0, voice

        streams.pop().close()  # noticed at its next keep-alive, which fails to reach the client

        def reopened() -> RawStream | None:
            stream = _open_events(gunicorn_api, job_id, caller)
            if stream.status == 200:
                return stream
            stream.close()
            return None

        streams.append(wait_for(reopened, 30, "a slot freed by the closed stream", 0.2))
    finally:
        for stream in streams:
            stream.close()
    wait_for(lambda: _slots(redis_client, caller) == 0, 30, "every slot given back once the streams closed")


def test_a_growing_download_of_a_job_canceled_midway_ends_cut_short_not_as_a_whole_file(
    gunicorn_api: ApiProcess, redis_client: redis.Redis
) -> None:
    store = JobStore(redis_client, ttl=600)
    job_id = _stalled_job(store)
    stream = RawStream(gunicorn_api.port, f"/v1/jobs/{job_id}/audio", source="127.0.0.79")
    try:
        assert stream.status == 200 and stream.headers.get("transfer-encoding") == "chunked"
        stream.until(b"RIFF")  # segment 0 is on its way
        store.cancel(job_id)
        with pytest.raises(ConnectionError):  # the server closes the connection without the last, empty chunk
            stream.until(b"\r\n0\r\n\r\n")
        assert not stream.buffer.endswith(b"0\r\n\r\n"), "a whole chunked body would end so"
    finally:
        stream.close()


def test_a_growing_audio_stream_whose_client_left_gives_its_slot_back_while_its_job_is_stalled(
    gunicorn_api: ApiProcess, redis_client: redis.Redis
) -> None:
    store = JobStore(redis_client, ttl=600)
    job_id = _stalled_job(store)
    caller = "127.0.0.78"
    stream = RawStream(gunicorn_api.port, f"/v1/jobs/{job_id}/audio", source=caller)
    assert stream.status == 200 and _slots(redis_client, caller) == 1
    stream.close()  # segment 1 never comes: nothing is written that could fail to reach the client
    # Seen at the stream's next keep-alive turn (1 s here), long before its slot would lapse unrenewed (70 s).
    wait_for(lambda: _slots(redis_client, caller) == 0, 10, "the slot given back once the client left")
    store.cancel(job_id)


# --- the event hub and the slots, in this process ---------------------------------------------------------


def _entry_id(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _blocked(client: redis.Redis, name: str | None = None) -> list[dict[str, Any]]:
    """Return the connections blocked in XREAD now (``cmd`` alone names a connection's last command)."""
    return [
        c
        for c in client.client_list()
        if c.get("cmd") == "xread" and "b" in c.get("flags", "") and (name is None or c.get("name") == name)
    ]


def test_one_hub_wakes_every_waiter_of_every_stream_over_one_redis_connection(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    own = redis.Redis.from_url(redis_server.url, client_name="hub-under-test")
    hub = EventHub(own, block_ms=100)
    streams = [f"tts:job:{{hub-test-{n}}}:events" for n in range(5)]
    seen: dict[int, str] = {}

    def follower(n: int) -> None:
        seen[n] = hub.wait(streams[n % len(streams)], "0-0", 30)

    threads = [threading.Thread(target=follower, args=(n,)) for n in range(50)]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: hub.waiting() == 50, 10, "50 followers waiting")
        wait_for(lambda: _blocked(redis_client, "hub-under-test"), 10, "the hub blocked in XREAD")
        assert len([c for c in redis_client.client_list() if c.get("name") == "hub-under-test"]) == 1
        added = [_entry_id(redis_client.xadd(stream, {"type": "segment"})) for stream in streams]
        for thread in threads:
            thread.join(10)
        assert seen == {n: added[n % len(streams)] for n in range(50)}
    finally:
        for stream in streams:  # wakes any follower still waiting
            redis_client.xadd(stream, {"type": "segment"})
        for thread in threads:
            thread.join(10)
        redis_client.delete(*streams)
        own.close()


def test_a_waiter_misses_nothing_written_between_its_read_and_its_wait(redis_client: redis.Redis) -> None:
    hub = EventHub(redis_client, block_ms=200)
    busy, quiet = "tts:job:{hub-busy}:events", "tts:job:{hub-quiet}:events"
    try:
        other = threading.Thread(target=hub.wait, args=(busy, "0-0", 5))
        other.start()
        wait_for(lambda: hub.waiting() == 1, 10, "the hub blocked on another stream")
        last = "0-0"  # what a follower read before looking at the job
        written = _entry_id(redis_client.xadd(quiet, {"type": "segment"}))  # lands before it waits
        assert hub.wait(quiet, last, 10) == written
        assert hub.wait(quiet, written, 0.3) == written  # nothing newer: the wait times out with what it had
        redis_client.xadd(busy, {"type": "segment"})
        other.join(10)
    finally:
        redis_client.delete(busy, quiet)


def test_slots_of_a_process_that_crashed_lapse_on_their_own(redis_client: redis.Redis) -> None:
    slots = CallerStreams(redis_client, ttl_s=1.0)
    caller = "crash-test"
    redis_client.delete(keys.streams(caller))
    assert slots.open(caller, limit=2) is not None
    assert slots.open(caller, limit=2) is not None
    assert slots.open(caller, limit=2) is None
    # Nobody gives these back (their process is gone): they lapse, and the caller may open streams again.
    wait_for(lambda: slots.open(caller, limit=2), 10, "a lapsed slot counted no more", 0.1)
    redis_client.delete(keys.streams(caller))


def test_a_stream_gives_its_slot_back_when_its_response_closes_even_unread(app: Flask) -> None:
    store: JobStore = app.extensions["tts"].store
    job_id = _held_job(store)
    client = app.test_client()
    caller_key = keys.streams("ip-127.0.0.1")
    redis_client: redis.Redis = app.extensions["tts"].redis
    for read_some in (True, False):
        response = client.get(f"/v1/jobs/{job_id}/events", buffered=False)
        assert response.status_code == 200
        if read_some:
            assert next(response.response) == b"retry: 1000\n\n"  # type: ignore[call-overload]
        assert redis_client.zcard(caller_key) == 1
        response.close()
        assert redis_client.zcard(caller_key) == 0
    assert app.extensions["tts"].holds.open_here == 0


# --- a finished job's file ----------------------------------------------------------------------------------


def _decoded(data: bytes) -> np.ndarray:
    samples, rate = sf.read(io.BytesIO(data), dtype="int16")
    assert rate == RATE
    return np.asarray(samples, dtype=np.float64)


def _similarity(decoded: np.ndarray, reference: np.ndarray) -> float:
    """Return the correlation of a lossy decode with the reference, after the codec's delay is taken out."""
    window = reference[: RATE // 2]
    lags = range(0, 3000)
    lag = max(lags, key=lambda k: float(np.dot(decoded[k : k + len(window)], window)))
    length = min(len(reference), len(decoded) - lag)
    return float(np.corrcoef(decoded[lag : lag + length], reference[:length])[0, 1])


@pytest.mark.parametrize("fmt", sorted(MEDIA_TYPES))
def test_a_long_jobs_audio_in_each_format_decodes_to_its_segments_in_order(app: Flask, fmt: str) -> None:
    store: JobStore = app.extensions["tts"].store
    job_id = _finished_job(store, fmt, segments=80)
    response = app.test_client().get(f"/v1/jobs/{job_id}/audio")
    assert response.status_code == 200, response.get_data(as_text=True)
    data = response.data
    expected = b"".join(p for p in store.segments(job_id, 80) if p is not None)
    assert len(expected) == 80 * SEGMENT_SAMPLES * 2
    if fmt == "pcm":
        assert data == expected
        return
    reference = np.frombuffer(expected, dtype="<i2").astype(np.float64)
    decoded = _decoded(data)
    if fmt in ("wav", "flac"):
        assert np.array_equal(decoded, reference)
    else:  # lossy: the same sound, give or take the codec's delay and padding
        assert abs(len(decoded) - len(reference)) < RATE // 5
        assert _similarity(decoded, reference) > 0.9
    if fmt == "wav":  # the header states the exact sizes
        assert int.from_bytes(data[4:8], "little") == len(data) - 8
        assert int.from_bytes(data[40:44], "little") == len(data) - 44
        assert int(response.headers["Content-Length"]) == len(data)


def _streamed_peak(app: Flask, job_id: str) -> tuple[int, int]:
    """Download the job's file without keeping it; return its size and the peak memory Python allocated."""
    client = app.test_client()
    tracemalloc.start()
    try:
        response = client.get(f"/v1/jobs/{job_id}/audio", buffered=False)
        assert response.status_code == 200
        chunks: Iterator[bytes] = response.iter_encoded()
        tracemalloc.reset_peak()
        size = sum(len(chunk) for chunk in chunks)
        _, peak = tracemalloc.get_traced_memory()
        response.close()
    finally:
        tracemalloc.stop()
    return size, peak


@pytest.mark.parametrize("fmt", sorted(MEDIA_TYPES))
def test_a_long_download_holds_a_few_segments_in_memory_never_the_file(app: Flask, fmt: str) -> None:
    store: JobStore = app.extensions["tts"].store
    segments = 120  # two minutes of 1 s segments: 5.8 MB of PCM
    job_id = _finished_job(store, fmt, segments=segments, samples=RATE)
    size, peak = _streamed_peak(app, job_id)
    segment_bytes = RATE * 2
    assert size > 0
    # A few segments (the one read, its decoded PCM, its encoded bytes, garbage the collector has not reached
    # yet), never the file's 120: measured 4 to 9 segments' worth.
    assert peak < 12 * segment_bytes, f"{fmt}: peak {peak} bytes for a {segments * segment_bytes}-byte job"


# --- held responses whose client stops taking them -------------------------------------------------------------

WRITE_TIMEOUT_S = 2.0  # shortened from 30 s, and the long-poll limit from 30 s to 2 s (slots lapse after 14 s)


@pytest.fixture(scope="module")
def impatient_api(settings_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiProcess]:
    """The make run gunicorn with a short write timeout and short slot lapses, so that both show in seconds."""
    env = {**settings_env, "TTS_STREAM_WRITE_TIMEOUT_S": str(WRITE_TIMEOUT_S), "TTS_MAX_WAIT_S": "2",
           "TTS_STREAM_KEEPALIVE_S": "1"}  # fmt: skip
    server = ApiProcess(env, tmp_path_factory.mktemp("impatient") / "gunicorn.log", processes=1)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_stalled_growing_stream_renews_its_slot_at_its_idle_turns_so_the_callers_limit_keeps_counting_it(
    impatient_api: ApiProcess, redis_client: redis.Redis
) -> None:
    store = JobStore(redis_client, ttl=600)
    job_id = _stalled_job(store)
    caller = "127.0.0.81"
    stream = RawStream(impatient_api.port, f"/v1/jobs/{job_id}/audio", source=caller)
    assert stream.status == 200
    slots = keys.streams(f"ip-{caller}")
    ((slot, lapses_at),) = redis_client.zrange(slots, 0, -1, withscores=True)
    # Nothing is written while segment 1 never comes; the slot must still be renewed before it lapses (14 s).
    wait_for(lambda: (redis_client.zscore(slots, slot) or 0) > lapses_at, 12, "the idle stream to renew its slot")
    stream.close()
    wait_for(lambda: _slots(redis_client, caller) == 0, 10, "the slot given back once the client left")
    store.cancel(job_id)


def test_a_client_that_stops_taking_a_download_is_dropped_after_the_write_timeout_and_its_slot_freed(
    impatient_api: ApiProcess, redis_client: redis.Redis
) -> None:
    store = JobStore(redis_client, ttl=600)
    job_id = _finished_job(store, "wav", segments=6, samples=60 * RATE)  # a 17 MB file: more than the buffers hold
    caller = "127.0.0.82"
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window stays small
    sock.bind((caller, 0))
    sock.connect(("127.0.0.1", impatient_api.port))
    sock.sendall(f"GET /v1/jobs/{job_id}/audio HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    wait_for(lambda: _slots(redis_client, caller) == 1, 10, "the download to hold its slot")
    # It reads nothing more: the server's writes stall, and the connection ends after the write timeout.
    wait_for(lambda: _slots(redis_client, caller) == 0, 30, "the stalled download's slot given back")
    assert "took nothing of its response in time" in impatient_api.log_tail()
    sock.close()


def test_a_voice_socket_whose_client_reads_nothing_is_closed_after_the_write_timeout_and_its_job_canceled(
    impatient_api: ApiProcess, worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Message, Request, TextMessage

    caller = "127.0.0.83"
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind((caller, 0))
    sock.connect(("127.0.0.1", impatient_api.port))
    client = WSConnection(ConnectionType.CLIENT)
    sock.sendall(client.send(Request(host="test", target="/v1/jobs/stream")))
    text = " ".join(f"Sentence number {i} is here, and it is long enough to take a while." for i in range(200))
    job_id = None
    while job_id is None:  # read as far as the job's id, then nothing more
        client.receive_data(sock.recv(4096))
        for event in client.events():
            if isinstance(event, AcceptConnection):
                sock.sendall(client.send(Message(data='{"model": "espeak-en", "format": "wav"}')))
            elif isinstance(event, TextMessage) and event.data.startswith('{"type": "job"'):
                job_id = json.loads(event.data)["id"]
    for message in (text, '{"final": true}'):
        sock.sendall(client.send(Message(data=message)))
    assert _slots(redis_client, caller) == 1
    # It reads nothing more: the server's sends stall once the buffers are full, and the write timeout ends it.
    wait_for(lambda: _slots(redis_client, caller) == 0, 60, "the stalled socket's slot given back")
    wait_for(lambda: redis_client.hget(keys.job(job_id), "status") == b"canceled", 10, "its job canceled")
    sock.close()
