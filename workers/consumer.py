"""Celery's consumer, made to survive a broker connection that breaks under it.

On a connection loss, Celery 5.7's consumer collects the connection and then closes it. With
kombu 5.7's Redis transport the close restores unacknowledged messages through the collected
connection, whose client is gone, and raises AttributeError: an "Unrecoverable error" that
stops the worker (seen here on Redis restarts and dropped connections). Here that error ends
the clean-up instead, and the consumer reconnects as it does after any connection error.
The messages it would have restored stay in kombu's unacked hash, where the janitor's
account finds any whose segment is still missing (workers/janitor.py).
"""

from __future__ import annotations

import logging

from celery.worker.consumer import Consumer

log = logging.getLogger(__name__)


class ResilientConsumer(Consumer):  # type: ignore[misc]
    """Reconnect after a connection loss even when closing the lost connection fails."""

    def on_connection_error_after_connected(self, exc: BaseException) -> None:
        """Clean up after a lost broker connection, as Celery does, and never stop the worker over it."""
        try:
            super().on_connection_error_after_connected(exc)
        except AttributeError as e:
            log.warning("closing the lost broker connection failed (%r); reconnecting all the same", e)
