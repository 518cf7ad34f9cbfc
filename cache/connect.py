"""Clients of the job store from its URL: one Redis, or the primary a Sentinel group names.

Every process builds its Redis clients here, so a ``redis+sentinel://`` URL (core.store_url) works wherever a
``redis://`` one does. A Sentinel-managed client asks the Sentinels for the primary when it connects, and drops
its connections when they name another, or when the server it reaches answers READONLY (a primary demoted to
replica): a failover is followed without a restart, at the price of the commands in flight at that moment,
which fail with a ConnectionError like any dropped connection. The job store's clients note which node each reply
came from (cache/nodes.py), so that a confirmation can tell a reply of the primary from one of a stale node; the
sentence cache's, on a group of its own, must not (its nodes are never the job store's primary).
"""

from __future__ import annotations

from typing import Any, cast

import redis
from redis._parsers.base import BaseParser
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from cache.nodes import NodeNotingConnection
from core.store_url import SentinelUrl, is_sentinel, parse_sentinel_url


class NoReplicasError(redis.ConnectionError):
    """A primary refused a write: fewer replicas than its ``min-replicas-to-write`` acknowledge it.

    Either it is cut off from them (a split brain: the Sentinels are promoting another) or they are failing. To a
    client that is the store being unreachable for writes, and it is handled as such: redis-py retries it, the
    API answers 503 with Retry-After, a worker retries the segment without counting an attempt, and a Sentinel-
    managed connection is dropped, so the next one asks the Sentinels which primary to use.
    """


# redis-py maps a reply's error code to an exception class in one table; NOREPLICAS is not in it (a bare
# ResponseError, which every caller would take for a bug in the command).
BaseParser.EXCEPTION_CLASSES["NOREPLICAS"] = NoReplicasError

#: The options of a data connection that a connection to a Sentinel takes too: a dead Sentinel must cost a
#: timeout no longer than a dead primary would.
_SENTINEL_OPTIONS = ("socket_timeout", "socket_connect_timeout", "socket_keepalive")


class SentinelBlockingPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """A bounded pool of connections to the primary a Sentinel group names: callers past the bound wait their turn."""


def sentinel_of(target: SentinelUrl, options: dict[str, Any]) -> Sentinel:
    """Return the Sentinel client of a group, its connections as short-lived as the data connections'."""
    sentinel_kwargs: dict[str, Any] = {name: options[name] for name in _SENTINEL_OPTIONS if name in options}
    # No retries: redis-py's default retries a dead Sentinel ten times with backoff, where the next Sentinel would
    # answer at once (the primary is asked of them at every connection and every confirmation).
    sentinel_kwargs["retry"] = Retry(NoBackoff(), 0)
    if target.sentinel_password:
        sentinel_kwargs["password"] = target.sentinel_password
    return Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]


def _primary(url: str, options: dict[str, Any], *, note_nodes: bool) -> redis.Redis:
    target = parse_sentinel_url(url)
    auth: dict[str, Any] = {"db": target.db, "username": target.username, "password": target.password}
    if note_nodes:
        auth["connection_class"] = NodeNotingConnection
    primary = sentinel_of(target, options).master_for(target.service, **auth, **options)  # type: ignore[no-untyped-call]
    return cast(redis.Redis, primary)


def redis_client(url: str, *, note_nodes: bool = False, **options: Any) -> redis.Redis:
    """Return a client of the store ``url`` names; ``options`` are redis-py's connection options. ``note_nodes``:
    a Sentinel-managed client notes each reply's node (the job store's clients, whose answers are confirmed)."""
    if is_sentinel(url):
        return _primary(url, options, note_nodes=note_nodes)
    return redis.Redis.from_url(url, **options)


def blocking_pool(
    url: str, *, max_connections: int, timeout: float, note_nodes: bool = False, **options: Any
) -> redis.ConnectionPool:
    """Return a pool of at most ``max_connections`` to the store ``url`` names; a caller waits up to ``timeout``
    seconds for one. ``note_nodes`` as for ``redis_client``."""
    if is_sentinel(url):
        bounded = {"connection_pool_class": SentinelBlockingPool, "max_connections": max_connections}
        return _primary(url, {**options, **bounded, "timeout": timeout}, note_nodes=note_nodes).connection_pool
    return redis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=timeout, **options)
