"""Logging set-up shared by the API and the workers: text for people, JSON for log pipelines."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

#: Attributes a record always has; anything else came from ``extra=`` and goes into the JSON.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON object per line, with its ``extra`` fields (job_id, segment, …)."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as JSON."""
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def setup_logging(level: str, *, fmt: str = "text") -> None:
    """Log to stderr, as text lines or JSON objects."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
