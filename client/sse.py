"""Server-sent events, parsed as the WHATWG rules say, from a stream cut into chunks anywhere."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from typing import Any


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


#: The parser's earlier, private name.
_parse_sse = parse_sse
