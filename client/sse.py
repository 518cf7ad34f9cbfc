"""Server-sent events, parsed as the WHATWG rules say, from a stream cut into chunks anywhere."""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import requests

from client.errors import TTSClientError

#: How many times ``reconnecting`` connects again in a row without receiving anything new.
SSE_RECONNECTS = 5


def parse_sse(chunks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """Yield the events ({"event", "id", "data"}) of a server-sent stream cut into chunks anywhere (WHATWG rules)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    event: str | None = None
    event_id: str | None = None
    data: list[str] = []
    for chunk in chunks:
        text = pending + decoder.decode(chunk)
        # A CR at the end may be half of a CRLF whose LF is in the next chunk.
        held = "\r" if text.endswith("\r") else ""
        *lines, pending = text[: len(text) - len(held)].replace("\r\n", "\n").replace("\r", "\n").split("\n")
        pending += held
        for line in lines:
            if not line:
                if data:
                    joined = "\n".join(data)
                    try:
                        payload: Any = json.loads(joined)
                    except ValueError:
                        payload = joined
                    yield {"event": event or "message", "id": event_id, "data": payload}
                event, event_id, data = None, None, []
                continue
            if line.startswith(":"):
                continue  # a comment: the service's keep-alive
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id" and "\0" not in value:
                event_id = value


def reconnecting(
    connect: Callable[[dict[str, str]], requests.Response],
    what: str,
    *,
    last_event_id: str | int | None = None,
    ends: frozenset[str],
) -> Iterator[dict[str, Any]]:
    """Yield the events of the stream ``connect(headers)`` opens, connecting again after a drop with the last event's
    id (``Last-Event-ID``), until an event named in ``ends``; raise ``stream_lost`` after ``SSE_RECONNECTS`` drops
    in a row that brought nothing new, and any error the service answers."""
    failures = 0
    while True:
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        received = False
        try:
            with connect(headers) as response:
                for event in parse_sse(response.iter_content(chunk_size=None)):
                    received = True
                    if event["id"] is not None:
                        last_event_id = event["id"]
                    yield event
                    if event["event"] in ends:
                        return
        except (TTSClientError, requests.RequestException) as e:
            if isinstance(e, TTSClientError) and e.status != 0:
                raise
        failures = 0 if received else failures + 1
        if failures > SSE_RECONNECTS:
            raise TTSClientError(0, "stream_lost", f"the event stream of {what} kept dropping")
        time.sleep(min(0.2 * failures, 2.0))


#: The parser's earlier, private name.
_parse_sse = parse_sse
