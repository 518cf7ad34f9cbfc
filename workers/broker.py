"""A fix for kombu's Redis transport, so that a broker connection lost under a worker never stops it.

On a connection loss, Celery 5.7's consumer collects the connection, then closes it, and acks
that finish later still reach the old channel. With kombu 5.7 both go through the collected
connection, whose client is gone, and kombu raised AttributeError from ``_connparams``: an
"Unrecoverable error" that stopped the worker (seen here on Redis restarts and on dropped
connections). Raised as the connection error it is, Celery's and kombu's own handling applies:
the close is abandoned, the ack is logged as failed, and the consumer reconnects. Messages the
old channel would have restored stay in kombu's unacked hash; the janitor's account finds any
whose segment is still missing (workers/janitor.py).

Why the close reaches a dead client at all: kombu's Redis ``Channel.close()`` first reads the reply
of a pending BRPOP, and catches only ``Empty`` there. When another socket (the pub/sub one) reports
the loss first, that read raises on the dead BRPOP socket and the close is abandoned inside
``collect()``, while the client is still there; it then runs again from ``connection.close()``,
after ``collect()`` detached the client. So a close whose pending BRPOP cannot be read carries on
here too, as it does when the BRPOP socket reports the loss itself: unacknowledged messages are
restored while Redis is reachable, and the channel keeps a pool built from live connection
details, so acks of tasks that finish after the reconnect still land ("Couldn't ack" otherwise).
"""

from __future__ import annotations

from queue import Empty
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

_connparams = kombu_redis.Channel._connparams
_close = kombu_redis.Channel.close


def _connparams_of_a_live_connection(self: Any, asynchronous: bool = False) -> Any:
    if self.connection is None or self.connection.client is None:
        raise redis.ConnectionError("this broker channel's connection was closed after a connection loss")
    return _connparams(self, asynchronous)  # type: ignore[no-untyped-call]


def _close_even_if_the_brpop_reply_is_lost(self: Any) -> None:
    if self._in_poll:
        try:
            self._brpop_read()  # clears _in_poll whatever happens
        except (Empty, *self.connection_errors):
            pass  # the connection died under the pending BRPOP: close the rest all the same
    _close(self)  # type: ignore[no-untyped-call]


def install() -> None:
    """Make kombu's Redis channels close fully after a connection loss, and fail with connection errors after."""
    kombu_redis.Channel._connparams = _connparams_of_a_live_connection  # type: ignore[method-assign]
    kombu_redis.Channel.close = _close_even_if_the_brpop_reply_is_lost  # type: ignore[method-assign]
