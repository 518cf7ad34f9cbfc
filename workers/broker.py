"""A fix for kombu's Redis transport, so that a broker connection lost under a worker, or a broker at its memory
limit, never stops it.

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

import logging
from queue import Empty
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

log = logging.getLogger(__name__)

_connparams = kombu_redis.Channel._connparams
_close = kombu_redis.Channel.close
_append = kombu_redis.QoS.append
_restore_visible = kombu_redis.QoS.restore_visible
_create_client = kombu_redis.Channel._create_client
#: What a Redis at its maxmemory answers a write (or a MULTI holding one) with.
_REFUSED_FULL = (redis.OutOfMemoryError, redis.exceptions.ExecAbortError)


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


def _append_or_reconnect(self: Any, message: Any, delivery_tag: str) -> None:
    try:
        _append(self, message, delivery_tag)  # type: ignore[no-untyped-call]
    except _REFUSED_FULL as e:
        # A Redis at its maxmemory refuses the record of a delivery it just gave out (its MULTI is refused whole:
        # redis-py raises the refusal or the EXECABORT, depending on the reply it reads first).
        # Celery takes any other error here as unrecoverable and the worker exits; a connection error it meets by
        # reconnecting. The delivery is then in neither the queue nor the unacked hash: the janitor's account
        # finds its segment missing and publishes it again (workers/janitor.py), as for a delivery lost with a
        # connection.
        raise redis.ConnectionError(f"the broker's Redis refused to record a delivery: {e}") from e


def _restore_visible_unless_full(self: Any, *args: Any, **kwargs: Any) -> None:
    try:
        _restore_visible(self, *args, **kwargs)  # type: ignore[no-untyped-call]
    except _REFUSED_FULL:
        # Run as a consumer (re)connects, under a lock whose SET a full Redis refuses: Celery would take that as
        # unrecoverable too. Skipped, it runs at the next connect; the janitor hands on what waits meanwhile.
        log.warning("the broker's Redis is at its memory limit: unacknowledged deliveries are restored later")


def _one_client_per_pool(self: Any, asynchronous: bool = False) -> Any:
    # kombu builds a new redis-py client for every ack and every delivery's record (Channel.conn_or_acquire), and a
    # client's construction copies its ~250 response callbacks: a tenth of a busy worker's own CPU (py-spy at 50
    # callers). A client over a pool is thread-safe, so the channel keeps one per pool; a reconnect's new pool gets
    # its own. The asynchronous (BRPOP) client is kombu's own cached one already.
    if asynchronous:
        return _create_client(self, asynchronous=True)  # type: ignore[no-untyped-call]
    pool = self.pool
    client = self.__dict__.get("_tts_client")
    if client is None or client.connection_pool is not pool:
        client = self.__dict__["_tts_client"] = _create_client(self)  # type: ignore[no-untyped-call]
    return client


def install() -> None:
    """Make kombu's Redis channels close fully after a connection loss, and fail with connection errors after
    (a delivery Redis refused to record at its memory limit included); let a channel keep one client per pool."""
    kombu_redis.Channel._connparams = _connparams_of_a_live_connection  # type: ignore[method-assign]
    kombu_redis.Channel.close = _close_even_if_the_brpop_reply_is_lost  # type: ignore[method-assign]
    kombu_redis.QoS.append = _append_or_reconnect  # type: ignore[method-assign]
    kombu_redis.QoS.restore_visible = _restore_visible_unless_full  # type: ignore[method-assign]
    kombu_redis.Channel._create_client = _one_client_per_pool  # type: ignore[method-assign]
