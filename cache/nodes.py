"""Which data nodes a piece of work read from or wrote to: the evidence a confirmation needs after a failover.

A client of a Sentinel group keeps the connections it has. After a failover some of them may still reach the old
primary, which answers from its stale data (and takes writes that its demotion will erase) until the Sentinels
make it a replica. A confirmation (cache/replication.py) proves that one node holds what was read or written and
has a replica holding it too; it proves nothing about a reply that came from another node. So the connections of
a Sentinel-managed client note the node of every reply they read, into the log that is open in the current
context (a request, a chunk of a stream), if any.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from redis.sentinel import SentinelManagedConnection

#: A data node, as its clients reach it.
Node = tuple[str, int]

_open_log: ContextVar[set[Node] | None] = ContextVar("tts_touched_nodes", default=None)


class NodeNotingConnection(SentinelManagedConnection):
    """A connection to the primary a Sentinel group names that notes each reply's node in the open log."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        response = super().read_response(*args, **kwargs)
        touched = _open_log.get()
        if touched is not None:
            touched.add((str(self.host), int(self.port)))
        return response


@contextlib.contextmanager
def noting() -> Iterator[set[Node]]:
    """Open a log of the nodes replies come from in this context; yield it (it fills as replies arrive)."""
    touched: set[Node] = set()
    token = _open_log.set(touched)
    try:
        yield touched
    finally:
        _open_log.reset(token)


def open_log() -> set[Node]:
    """Open a log for the rest of this context (a request: its hooks cannot share a ``with``); return it."""
    touched: set[Node] = set()
    _open_log.set(touched)
    return touched


def current_log() -> set[Node] | None:
    """Return the log open in this context, or None."""
    return _open_log.get()


def close_log() -> None:
    """Close the log ``open_log`` opened."""
    _open_log.set(None)
