"""How the real server (gunicorn, gevent workers) reads a request body that is malformed, cut short or stalled:
each is a JSON error within a bounded time, never a 500, a hang or an accepted fragment."""

from __future__ import annotations

import http.client
import json
import socket
import time
from typing import Any

import pytest

from api.validation import BODY_WAIT_S, DRAIN_MAX_S
from tests.support.servers import ApiProcess

#: What a slow, shared test machine may add to a bound before an answer counts as late.
SLACK_S = 5.0
#: 24 bytes of a valid job body, under a Content-Length that announces more.
FRAGMENT = b'{"text": "Hello, world"}'
JOB_ID = "0" * 32


def _connect(api: ApiProcess, timeout: float) -> socket.socket:
    return socket.create_connection(("127.0.0.1", api.port), timeout=timeout)


def _head(path: str, *fields: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json", *fields, "", ""]
    return "\r\n".join(lines).encode()


def _answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    assert response.getheader("Content-Type") == "application/json"
    return response.status, json.loads(response.read())


@pytest.mark.parametrize("path", ["/v1/jobs", f"/v1/jobs/{JOB_ID}/text", "/v1/audio/speech"])
def test_a_malformed_chunked_body_is_answered_400_with_a_json_error(gunicorn_api: ApiProcess, path: str) -> None:
    with _connect(gunicorn_api, timeout=10) as sock:
        sock.sendall(_head(path, "Transfer-Encoding: chunked") + b"zz\r\nabc\r\n0\r\n\r\n")
        status, body = _answer(sock)
    assert status == 400, body
    assert body["error"]["code"] == "bad_request"
    assert "chunked" in body["error"]["message"]


@pytest.mark.parametrize(
    ("chunks", "half_close"),
    [
        pytest.param(b"3\r\nabcdef\r\n0\r\n\r\n", False, id="a chunk longer than its size"),
        pytest.param(b"3;=\r\nabc\r\n0\r\n\r\n", False, id="a chunk extension that is not a token"),
        pytest.param(b"10\r\n" + FRAGMENT[:10], True, id="a body that ends inside a chunk"),
        pytest.param(b"18\r\n" + FRAGMENT + b"\r\n", True, id="a body that ends before its last chunk"),
    ],
)
def test_every_kind_of_broken_chunked_body_is_a_400(gunicorn_api: ApiProcess, chunks: bytes, half_close: bool) -> None:
    with _connect(gunicorn_api, timeout=10) as sock:
        sock.sendall(_head("/v1/jobs", "Transfer-Encoding: chunked") + chunks)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        status, body = _answer(sock)
    assert status == 400, body
    assert body["error"]["code"] == "bad_request"
    assert "chunk" in body["error"]["message"], body


def test_a_body_cut_short_by_its_client_is_a_400_not_an_accepted_job(gunicorn_api: ApiProcess) -> None:
    with _connect(gunicorn_api, timeout=10) as sock:
        sock.sendall(_head("/v1/jobs", "Content-Length: 100") + FRAGMENT)
        sock.shutdown(socket.SHUT_WR)
        status, body = _answer(sock)
    assert status == 400, body
    assert body["error"]["code"] == "bad_request"
    assert "24 of the 100 bytes" in body["error"]["message"]


def test_a_body_that_stops_arriving_is_answered_408_once_its_time_is_up(gunicorn_api: ApiProcess) -> None:
    with _connect(gunicorn_api, timeout=BODY_WAIT_S + SLACK_S) as sock:
        sock.sendall(_head("/v1/jobs", "Content-Length: 100") + FRAGMENT)
        started = time.monotonic()
        status, body = _answer(sock)
        waited = time.monotonic() - started
        assert sock.recv(1) == b"", "the connection ends with the answer: the rest of the body is not coming"
    assert status == 408, body
    assert body["error"]["code"] == "request_timeout"
    assert "did not arrive" in body["error"]["message"]
    assert BODY_WAIT_S - 1 <= waited <= BODY_WAIT_S + SLACK_S


def test_an_over_limit_body_from_a_stalled_client_gets_its_413_at_once_and_a_bounded_wait(
    gunicorn_api: ApiProcess,
) -> None:
    with _connect(gunicorn_api, timeout=DRAIN_MAX_S / 2) as sock:
        sock.sendall(_head("/v1/jobs", "Content-Length: 300000") + b"a" * 1000)
        started = time.monotonic()
        status, body = _answer(sock)
        assert status == 413, body
        assert body["error"]["code"] == "payload_too_large"
        # The server reads and drops what the client may still send, so that its answer is not lost to a reset,
        # but only for so long: then it closes the connection of a client that sends nothing more.
        sock.settimeout(DRAIN_MAX_S + SLACK_S)
        assert sock.recv(1) == b""
        assert time.monotonic() - started <= DRAIN_MAX_S + SLACK_S
