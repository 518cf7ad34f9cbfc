"""The job WebSocket (``/v1/jobs/stream``) as the tests drive it: connect, read until the job ends, close."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from simple_websocket import Client, ConnectionClosed

from devstack.api import ApiProcess


def connect(api: ApiProcess) -> Client:
    """Open the job WebSocket of ``api``."""
    return Client.connect(api.url.replace("http://", "ws://") + "/v1/jobs/stream")


def receive_until_end(ws: Client, timeout: float = 60) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Return the JSON events and the binary frames received up to the job's last event (done, failed, ...)."""
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


def close(ws: Client) -> None:
    """Close the client's side. The server may have closed the socket first, after its last event: then the close
    is refused (ConnectionClosed) or, when the client's reader thread shut the socket between the library's check
    and its send, fails on the closed descriptor (OSError: seen once in CI)."""
    with contextlib.suppress(ConnectionClosed, OSError):
        ws.close()
