"""Promises kept across a failover: what is promised, written or served is on a replica first (Redis WAIT).

Replication is asynchronous: a primary that fails may take its last writes with it, and the replica promoted in
its place never had them. So, with replicas to wait for (``TTS_REDIS_WAIT_REPLICAS``; one under Sentinel):

- **Promises.** Before answering 202 for a job (or taking a text piece), the API waits until enough replicas hold
  everything written so far: the job, its idempotency claim, its first tasks on the broker. Past the timeout it
  refuses to promise (503): the work may still go on, and a retry with the same Idempotency-Key finds it.
- **Writes.** A segment or a job's end is written with a WAIT on the same connection, and every Sentinel is asked
  after it which node is primary (``Replication.execute``); a short count or another node raises
  ``Unreplicated``, which the worker handles as a lost connection: it tries the segment again on the primary the
  Sentinels name. A fragment is not waited for: the segment's write carries all of its audio, and a listener is
  sent only what a confirmation covers.
- **Answers.** Under a Sentinel group the API sends nothing it read until a confirmation that began after the
  read succeeds on the node the read came from (cache/nodes.py). An old primary that wakes after a failover
  answers from stale data, and applies the commands its clients queued while it was frozen, before it counts
  its replicas again; none of that reaches a caller, because its WAIT finds no replica.

Concurrent callers share confirmations: one round (a mark written, then WAIT) at a time, and a caller waits for
the first round that began after its reads. This is not strong consistency (a promoted replica may lack a write
another replica had), but with Sentinel promoting the most up-to-date replica, what was confirmed survives the
loss of its primary.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import redis
from redis.client import Pipeline

from cache import keys
from cache.connect import redis_client
from cache.nodes import Node, current_log, noting
from core.errors import ServiceUnavailable
from core.metrics import REPLICA_CONFIRMATIONS

#: What a short confirmation's 503 asks a caller to wait: about as long as Sentinel takes to promote a replica.
RETRY_AFTER_S = 5
#: Past WAIT's timeout, how long a caller still waits for its round: the Sentinels' answer and a margin.
ROUND_MARGIN_S = 2.0


class Unreplicated(redis.ConnectionError):
    """What was read or written is not known to be on a replica: too few confirmed it in time, or it came from a
    node other than the one that did (the old primary, after a failover).

    To a client that is the store being unreachable: a worker retries the segment without counting an attempt,
    the API answers 503 with Retry-After, and the client's idle connections are dropped, so that the next ones
    ask the Sentinels which primary to use.
    """


@dataclass(frozen=True)
class Round:
    """One confirmation: when it began, how many replicas confirmed, on which node, which node the Sentinels named
    primary after (None: not noted, or no Sentinels), or why there was none."""

    started: float
    confirmed: int
    node: Node | None
    primary: Node | None = None
    error: redis.RedisError | None = None


class Replication:
    """Wait until ``replicas`` replicas hold every write made so far, for at most ``timeout_ms``.

    ``rounds`` runs the shared confirmations (by default ``client``): a client of the same store whose socket
    timeout is short, so that a round stuck on a frozen node holds its waiters no longer than that.
    """

    def __init__(
        self, client: redis.Redis, *, replicas: int, timeout_ms: int, rounds: redis.Redis | None = None
    ) -> None:
        self.redis = client
        self.rounds = rounds or client
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self._changed = threading.Condition()
        self._leading = False  # a round is under way
        self._last: Round | None = None

    @property
    def patience_s(self) -> float:
        """How long a caller waits for a round of its own before it gives up: WAIT's timeout, and the Sentinels'
        answer and a margin after it."""
        return _patience_s(self.timeout_ms)

    def _round(self) -> Round:
        started = time.monotonic()
        try:
            with noting() as touched:
                pipe = self.rounds.pipeline(transaction=False)  # one connection: WAIT counts its last write
                pipe.set(keys.REPLICATION_MARK, f"{time.time():.3f}")
                pipe.execute_command("WAIT", self.replicas, self.timeout_ms)  # type: ignore[no-untyped-call]
                got = int(pipe.execute()[-1])
            return Round(started, got, _one(touched), self._named_primary())
        except redis.RedisError as e:
            return Round(started, 0, None, error=e)

    def _round_since(self, since: float) -> Round:
        """Return the first round that began at or after ``since``, running one unless one is under way; raise
        Unreplicated if none ends within ``patience_s`` of ``since``."""
        deadline = since + self.patience_s
        while True:
            with self._changed:
                last = self._last
                if last is not None and last.started >= since:
                    return last
                if self._leading:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        REPLICA_CONFIRMATIONS.labels("failed").inc()
                        raise Unreplicated(f"no confirmation from the job store within {self.patience_s:g} s")
                    self._changed.wait(remaining)
                    continue
                self._leading = True
            found = None
            try:
                found = self._round()
            finally:  # whatever ends the round (a greenlet killed too), its waiters are woken and one leads next
                with self._changed:
                    self._leading = False
                    if found is not None and (self._last is None or found.started > self._last.started):
                        self._last = found
                    self._changed.notify_all()
            return found

    def confirm(self, touched: Collection[Node] = (), *, since: float | None = None) -> Round:
        """Return a round that began after ``since`` (now by default) in which enough replicas confirmed, on the
        one node ``touched`` names; raise Unreplicated if there is none."""
        found = self._round_since(time.monotonic() if since is None else since)
        if found.error is not None:
            REPLICA_CONFIRMATIONS.labels("failed").inc()
            self._drop_idle()  # the node timed out or went away: the next connections ask the Sentinels
            raise Unreplicated(f"no confirmation from the job store: {found.error}") from found.error
        self._judge(found.confirmed, found.node, found.primary)
        strangers = sorted(set(touched) - {found.node}) if found.node is not None else []
        if strangers:
            REPLICA_CONFIRMATIONS.labels("other_node").inc()
            self._drop_idle()
            raise Unreplicated(
                f"it came from {_named(strangers)}, not from the primary that confirmed it ({_named([found.node])}):"
                " the job store has failed over"
            )
        REPLICA_CONFIRMATIONS.labels("confirmed").inc()
        return found

    def confirm_noted(self) -> None:
        """Confirm what this context's open log (cache/nodes.py) noted since its last confirmation, then clear it.
        No replicas to wait for, no log, or nothing noted: return at once."""
        touched = current_log()
        if not self.replicas or not touched:
            return
        self.confirm(touched)
        touched.clear()

    def ensure(self, what: str, *, then: str) -> None:
        """Return once ``what`` is on enough replicas; raise ServiceUnavailable (503) saying what to do ``then``
        if it is not within the timeout. With no replicas to wait for, return at once."""
        if self.replicas == 0:
            return
        touched = current_log()
        try:
            self.confirm(touched or ())
        except Unreplicated as e:
            raise ServiceUnavailable(f"{what} is written, but {e}: {then}", retry_after=RETRY_AFTER_S) from e
        if touched:
            touched.clear()

    def execute(self, pipe: Pipeline) -> list[Any]:
        """Execute ``pipe`` and WAIT on its connection; return its replies once enough replicas hold them, or raise
        Unreplicated (the writes may be lost with a primary that failed over). With none to wait for, execute."""
        if self.replicas == 0:
            return pipe.execute()
        pipe.execute_command("WAIT", self.replicas, self.timeout_ms)  # type: ignore[no-untyped-call]
        with noting() as touched:
            *replies, got = pipe.execute()
        self._judge(int(got), _one(touched), self._named_primary())
        return replies

    def _named_primary(self) -> Node | None:
        """Return the node the newest view among the Sentinels that answer names primary (None: the client is not
        Sentinel-managed). Asked after a WAIT: an old primary that wakes may still have a replica the Sentinels
        have not moved yet, which confirms what it takes and then drops it, resynchronising from the new primary.

        Every Sentinel is asked, and the view with the highest configuration epoch wins: for a second or two after
        a failover only the Sentinel that ran it names the new primary. A Sentinel that sees the primary down or
        a failover under way confirms nothing: the node that answered may be the one being replaced."""
        pool = self.rounds.connection_pool
        manager, service = getattr(pool, "sentinel_manager", None), getattr(pool, "service_name", "")
        if manager is None:
            return None
        views = []
        for sentinel in manager.sentinels:
            try:
                state = sentinel.sentinel_master(service)
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                continue  # a dead Sentinel, or one that does not know the service: the others say
            flags = set(str(state.get("flags", "")).split(","))
            if flags & {"s_down", "o_down", "failover_in_progress"}:
                raise Unreplicated(f"a Sentinel sees the primary {_named([(str(state['ip']), int(state['port']))])}"
                                   f" as {','.join(sorted(flags))}: the job store is failing over")  # fmt: skip
            views.append((int(state.get("config-epoch", 0)), str(state["ip"]), int(state["port"])))
        if not views:
            raise Unreplicated("no Sentinel answered which node is the primary")
        _, host, port = max(views)
        return host, port

    def _judge(self, got: int, node: Node | None, primary: Node | None) -> None:
        """Raise Unreplicated unless ``got`` replicas are enough and ``node`` is the ``primary`` the Sentinels name;
        drop the idle connections when they reach another node (a short count on the primary itself is its
        replicas lagging: its connections are kept)."""
        moved = node is not None and primary is not None and node != primary
        if moved:
            self._drop_idle()
        if got < self.replicas:
            REPLICA_CONFIRMATIONS.labels("short").inc()
            raise Unreplicated(
                f"{got} of the {self.replicas} replicas it must be on confirmed it within {self.timeout_ms} ms (the "
                "job store is failing over, or its replicas lag)"
            )
        if moved:
            REPLICA_CONFIRMATIONS.labels("other_node").inc()
            raise Unreplicated(
                f"{_named([node])} confirmed it, but the Sentinels name {_named([primary])} primary: the job store "
                "has failed over"
            )

    def _drop_idle(self) -> None:
        """Close the clients' idle connections: each asks the Sentinels for the primary when it reconnects."""
        for client in {id(self.redis): self.redis, id(self.rounds): self.rounds}.values():
            client.connection_pool.disconnect(inuse_connections=False)


def replication_of(client: redis.Redis, url: str, *, replicas: int, timeout_ms: int) -> Replication:
    """Return the confirmations of the store ``url`` names, whose data commands go through ``client``; with replicas
    to wait for, rounds run on a client of their own that gives up after a caller's patience, so that a frozen
    node holds each caller only that long."""
    if not replicas:
        return Replication(client, replicas=0, timeout_ms=timeout_ms)
    rounds = redis_client(url, note_nodes=True, socket_timeout=_patience_s(timeout_ms),
                          socket_connect_timeout=ROUND_MARGIN_S)  # fmt: skip
    return Replication(client, replicas=replicas, timeout_ms=timeout_ms, rounds=rounds)


def _patience_s(timeout_ms: int) -> float:
    return timeout_ms / 1000 + ROUND_MARGIN_S


def _one(touched: set[Node]) -> Node | None:
    """Return the one node a round's replies came from; None if none was noted (a client that does not note).
    Replies from two (a command retried on a new connection mid-failover) confirm nothing."""
    if len(touched) > 1:
        raise Unreplicated(f"a confirmation's replies came from {_named(sorted(touched))}")
    return next(iter(touched), None)


def _named(nodes: Collection[Node | None]) -> str:
    return ", ".join(f"{host}:{port}" for host, port in (n for n in nodes if n is not None))
