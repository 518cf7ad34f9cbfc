"""A fix for kombu's Redis transport, so that a broker connection lost under a worker never stops it.

On a connection loss, Celery 5.7's consumer collects the connection, then closes it, and acks
that finish later still reach the old channel. With kombu 5.7 both go through the collected
connection, whose client is gone, and kombu raised AttributeError from ``_connparams``: an
"Unrecoverable error" that stopped the worker (seen here on Redis restarts and on dropped
connections). Raised as the connection error it is, Celery's and kombu's own handling applies:
the close is abandoned, the ack is logged as failed, and the consumer reconnects. Messages the
old channel would have restored stay in kombu's unacked hash; the janitor's account finds any
whose segment is still missing (workers/janitor.py).
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis

_connparams = kombu_redis.Channel._connparams


def _connparams_of_a_live_connection(self: Any, asynchronous: bool = False) -> Any:
    if self.connection is None or self.connection.client is None:
        raise redis.ConnectionError("this broker channel's connection was closed after a connection loss")
    return _connparams(self, asynchronous)  # type: ignore[no-untyped-call]


def install() -> None:
    """Make kombu's Redis channels raise a connection error, not AttributeError, once their connection is gone."""
    kombu_redis.Channel._connparams = _connparams_of_a_live_connection  # type: ignore[method-assign]
