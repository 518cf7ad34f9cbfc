"""The client against a server that trickles its answer a byte at a time: the whole answer is bounded by the
client's timeout, not each wait for a byte (which a trickle never lets run out)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from client.api import TTSClient, TTSClientError

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\nConnection: close\r\n\r\n"


def _trickle(server: socket.socket, stop: threading.Event, *, head_first: bool) -> None:
    """Answer each request with a byte every 0.1 s: of the headers, or (``head_first``) of the body after them."""
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn, contextlib.suppress(OSError):  # the client gives up, and a write fails
            conn.recv(65536)
            if head_first:
                conn.sendall(HEAD)
            trickled = b'{"id": "' + b"x" * 4000 if head_first else HEAD
            for byte in trickled:
                if stop.wait(0.1):
                    return
                conn.sendall(bytes([byte]))


@pytest.fixture(params=["headers", "body"])
def trickling(request: pytest.FixtureRequest) -> Iterator[str]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    thread = threading.Thread(target=_trickle, args=(server, stop), kwargs={"head_first": request.param == "body"})
    thread.daemon = True
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    server.close()


def _status_within(client: TTSClient) -> TTSClientError | None:
    """Ask ``client`` for a job's status on a thread; return its error (None: it answered), failing the test unless
    the call ended within 5 s. A byte every 0.1 s keeps each 1 s read alive: unbounded, it would run for minutes."""
    outcome: list[TTSClientError | None] = []

    def ask() -> None:
        try:
            client.status("0" * 32)
        except TTSClientError as e:
            outcome.append(e)
        else:
            outcome.append(None)
        finally:
            client.close()

    began = time.monotonic()
    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    asker.join(15)
    assert not asker.is_alive(), "the client waited on a trickling server far past its timeout"
    assert time.monotonic() - began < 5, "bounded by its 1 s timeout, not per byte"
    return outcome[0]


def test_an_answer_trickled_a_byte_at_a_time_fails_once_the_clients_timeout_has_passed(trickling: str) -> None:
    error = _status_within(TTSClient(trickling, timeout=1.0))
    assert isinstance(error, TTSClientError) and error.code == "unreachable", error
    assert "timed out" in str(error) or "took over 1 s" in str(error), str(error)


def test_a_proxy_that_trickles_its_answers_headers_is_bounded_as_well() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    threading.Thread(target=_trickle, args=(server, stop), kwargs={"head_first": False}, daemon=True).start()
    client = TTSClient("http://tts.invalid:8000", timeout=1.0)  # reached only through the proxy
    client.session.proxies = {"http": f"http://127.0.0.1:{server.getsockname()[1]}"}
    try:
        error = _status_within(client)  # its headers trickle for 9 s
        assert isinstance(error, TTSClientError) and error.code == "unreachable", error
    finally:
        stop.set()
        server.close()
