"""/v1/audio/speech is one call returning audio: a caller who hangs up leaves no job being made for nobody.

Under the real server (`make run`'s gunicorn, gevent), since only it says when a client has left.
"""

from __future__ import annotations

import json
import secrets
import socket
import string

import pytest
import redis
import requests

from cache import keys
from cache.jobstore import JobStatus, JobStore
from cache.records import JobRecord
from tests.support.processes import wait_for
from tests.support.servers import ApiProcess, WorkerProcess

#: How soon a job whose caller left must be canceled: a failed write or a keep-alive turn (1 s here) away.
CANCEL_WITHIN_S = 5


def _letters(number: int) -> str:
    """Spell ``number`` in letters (no digits: a number is spoken in words, which would lengthen the text)."""
    return "".join(string.ascii_lowercase[int(digit)] for digit in f"{number:03d}")


def _long_input() -> str:
    """Return about 17,000 characters of English in some 400 segments, none of which an earlier run has cached.

    The route always uses the sentence cache, so each run's sentences carry a word of their own."""
    run = _letters(secrets.randbelow(1000)) + _letters(secrets.randbelow(1000))
    return " ".join(f"Line {_letters(i)} of run {run} is plain and short." for i in range(400))


def _post(port: int, body: dict[str, object]) -> socket.socket:
    """Send POST /v1/audio/speech on a socket of its own; return the socket, the answer unread."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    payload = json.dumps(body).encode()
    head = (
        "POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def _read_headers(sock: socket.socket) -> dict[str, str]:
    """Read as far as the end of the answer's headers; return them (and the status line as ``status``)."""
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection before its headers")
        buffer += data
    lines = buffer.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return {**headers, "status": lines[0].split()[1]}


def _record(store: JobStore, job_id: str) -> JobRecord:
    record = store.get(job_id)
    assert record is not None, f"job {job_id} is gone"
    return record


def _assert_canceled_early(store: JobStore, job_id: str, api: ApiProcess) -> None:
    """Check that the job is canceled within a few seconds, having made far fewer segments than it has."""
    wait_for(lambda: _record(store, job_id).status.terminal, CANCEL_WITHIN_S, "the job ended once its caller left")
    record = _record(store, job_id)
    assert record.status is JobStatus.CANCELED, f"{record.segments_done} of {record.segments_total} made"
    assert record.segments_done < record.segments_total // 2, f"{record.segments_done} of {record.segments_total}"
    logged = f"speech job {job_id} canceled: its caller left"
    wait_for(lambda: logged in api.log_tail(400), CANCEL_WITHIN_S, "one line logged naming the canceled job")


def test_a_streamed_speech_whose_caller_hangs_up_after_the_headers_cancels_its_job(
    gunicorn_api: ApiProcess, worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    store = JobStore(redis_client, ttl=600)
    body = {"model": "espeak-en", "input": _long_input(), "response_format": "mp3"}
    sock = _post(gunicorn_api.port, body)
    try:
        headers = _read_headers(sock)
    finally:
        sock.close()  # the rest of the audio unread: the next writes to it fail
    assert headers["status"] == "200", headers
    _assert_canceled_early(store, headers["x-job-id"], gunicorn_api)


def test_a_flac_speech_whose_caller_hangs_up_while_it_waits_for_every_segment_cancels_its_job(
    gunicorn_api: ApiProcess, worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    store = JobStore(redis_client, ttl=600)
    earlier = set(redis_client.zrange(keys.LIVE_JOBS, 0, -1))
    body = {"model": "espeak-en", "input": _long_input(), "response_format": "flac"}
    sock = _post(gunicorn_api.port, body)
    try:
        # FLAC answers nothing until the job is done: its job is found as the one that went live, being made.
        (raw_id,) = wait_for(lambda: set(redis_client.zrange(keys.LIVE_JOBS, 0, -1)) - earlier, 30, "the job")
        job_id = raw_id.decode()
        wait_for(lambda: _record(store, job_id).segments_done > 0, 30, "its first segment made")
    finally:
        sock.close()  # nothing was written to it yet: only the route's own look at the socket can see this
    _assert_canceled_early(store, job_id, gunicorn_api)


@pytest.mark.parametrize("fmt", ["mp3", "flac"])
def test_a_speech_read_to_its_end_and_one_made_of_cached_segments_leave_their_jobs_done(
    gunicorn_api: ApiProcess, worker: WorkerProcess, redis_client: redis.Redis, fmt: str
) -> None:
    store = JobStore(redis_client, ttl=600)
    body = {"model": "espeak-en", "input": f"Read to its end in {fmt}. " + _long_input()[:200], "response_format": fmt}
    whole = requests.post(f"{gunicorn_api.url}/v1/audio/speech", json=body, timeout=60)
    assert whole.status_code == 200 and whole.content
    made = _record(store, whole.headers["X-Job-Id"])
    assert made.status is JobStatus.DONE and made.segments_done == made.segments_total
    # The route looked at its job before the body's last chunk went out: no line about it can still come.
    assert f"speech job {made.id} canceled" not in gunicorn_api.log_tail(400)
    # The same input again: every segment cached, so the job is done as it is accepted, and stays so.
    sock = _post(gunicorn_api.port, body)
    try:
        headers = _read_headers(sock)
    finally:
        sock.close()
    assert headers["status"] == "200", headers
    cached = _record(store, headers["x-job-id"])
    assert cached.status is JobStatus.DONE and cached.cached_segments == cached.segments_total
