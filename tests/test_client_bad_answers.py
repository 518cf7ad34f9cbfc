"""The `tts` command against a server that is not the TTS service, and with input that is not text: one line
saying what is wrong and exit status 1, never a traceback, a hang or memory without bound."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from client.cli import main

HEAD = "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n{length}Connection: close\r\n\r\n"


def _serve(answer: str, stop: threading.Event, server: socket.socket) -> None:
    """Answer every request with ``answer``: endless (JSON that never ends), html, noid or list."""
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)
            if answer == "endless":
                conn.sendall(HEAD.format(status="202 Accepted", kind="application/json", length="").encode())
                conn.sendall(b'{"id": "')
                with contextlib.suppress(OSError):  # the client gives up, and the write fails
                    for _ in range(100_000):
                        conn.sendall(b"x" * 65536)
                continue
            body = {"html": b"<html><body>Welcome</body></html>", "noid": b'{"status": "queued"}',
                    "list": b"[1, 2, 3]"}[answer]  # fmt: skip
            kind = "text/html" if answer == "html" else "application/json"
            head = HEAD.format(status="202 Accepted", kind=kind, length=f"Content-Length: {len(body)}\r\n")
            conn.sendall(head.encode() + body)


@pytest.fixture(params=["endless", "html", "noid", "list"])
def not_the_service(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(30)
    stop = threading.Event()
    thread = threading.Thread(target=_serve, args=(request.param, stop, server), daemon=True)
    thread.start()
    yield request.param, f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    server.close()


def test_say_against_a_server_that_is_not_the_service_says_so_and_exits_1(
    not_the_service: tuple[str, str], tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    kind, url = not_the_service
    began = time.monotonic()
    status = main(["say", "Hello.", "-o", str(tmp_path / "out.wav"), "--url", url])  # type: ignore[operator]
    err = capsys.readouterr().err
    assert status == 1 and err.startswith("error:") and "Traceback" not in err, err
    expected = {"endless": "over 1,048,576 bytes", "html": "not a JSON object (text/html)",
                "noid": "names no job id", "list": "not a JSON object"}[kind]  # fmt: skip
    assert expected in err, err
    assert time.monotonic() - began < 20
