"""Redis is no single point of failure: lose the primary of a Sentinel group mid-work, and lose nothing.

Each scenario runs the service on a Sentinel group as production runs one (a primary, two replicas, three
Sentinels; every data node ``min-replicas-to-write 1``; devstack/sentinel.py), at `make run`'s settings, submits
the standard workload with a listener on each job (tests/chaos/listeners.py), injects one fault while part of it
is in flight, and keeps submitting a job every ``PROBE_EVERY_S`` until one is accepted again. Every job answered
202, before the fault or after, must end done, each segment once (tests/chaos/audit.py), and no listener may
have heard a segment before the write of it that the store kept. `make chaos-failover` runs these and prints the
table.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

import pytest
import redis

from core.metrics import REPLICA_CONFIRMATIONS
from devstack.sentinel import SentinelGroup
from tests.chaos.audit import Audit
from tests.chaos.conftest import MakeStack
from tests.chaos.listeners import Listener, heard_before_kept, listen
from tests.chaos.stack import Stack
from tests.chaos.test_faults import conclude, run_to_end, submit, workload

pytestmark = [pytest.mark.chaos, pytest.mark.failover]

#: How often a caller tries to submit while the store fails over.
PROBE_EVERY_S = 0.25
#: An accepted job must be done this long after the fault (the issue's target).
DONE_WITHIN_S = 60
#: What a worker logs of a write no replica of the primary confirmed (cache/replication.py).
UNCONFIRMED = re.compile(r"Unreplicated|replicas it must be on|the Sentinels name")
#: The service must take new jobs again this long after the primary is lost (the issue's target).
ANSWERS_WITHIN_S = 15


@dataclass
class Prober:
    """Submit a job every PROBE_EVERY_S from the fault on; count 503s until the first 202."""

    stack: Stack
    fault_at: float = 0.0
    refused: int = 0
    other: list[int] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)
    accepting_again_s: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.fault_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = self.stack.client()
        seed = 1000
        while not self._stop.is_set():
            status, view, headers = self.stack.submit(client, workload(jobs=1, first_seed=seed)[0])
            seed += 1
            if status == 202:
                self.accepted.append(view["id"])
                if self.accepting_again_s is None:
                    self.accepting_again_s = round(time.monotonic() - self.fault_at, 1)
                    return
            elif status == 503 and "Retry-After" in headers:
                self.refused += 1
            else:
                self.other.append(status)
            self._stop.wait(PROBE_EVERY_S)

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
        self._stop.set()


@dataclass(frozen=True)
class Underway:
    """A stack on a Sentinel group with the standard workload part made: the moment a fault is injected."""

    stack: Stack
    group: SentinelGroup
    job_ids: list[str]
    started: float  # when the workload was submitted (monotonic)
    progress: str  # how far it had come
    listeners: list[Listener]
    unconfirmed_before: float  # the API's answers held back unconfirmed so far


def _unconfirmed() -> float:
    """Return how many answers, streamed chunks and promises this process's API held back unconfirmed."""
    return float(sum(REPLICA_CONFIRMATIONS.labels(r)._value.get() for r in ("short", "other_node", "failed")))


def _underway(make_stack: MakeStack) -> Underway:
    """Build a stack on a Sentinel group, start a worker, submit the standard workload with its models paused,
    and wait until part of it is in flight."""
    stack = make_stack(sentinel=True)
    assert stack.group is not None
    worker = stack.start_worker()
    started = time.monotonic()
    with stack.models_paused(worker):
        job_ids = submit(stack, workload())
        listeners = listen(stack, job_ids)
    written, attempted = stack.wait_in_flight(job_ids)
    progress = f"{written} written, {attempted - written} in flight"
    return Underway(stack, stack.group, job_ids, started, progress, listeners, _unconfirmed())


def run_with(prober: Prober, scenario: str, underway: Underway, fault_at: float) -> Audit:
    """Wait for the workload's jobs and those the prober got accepted to end; audit them all."""
    audit = run_to_end(underway.stack, scenario, underway.job_ids + prober.accepted, underway.started,
                       timeout=DONE_WITHIN_S, fault_at=fault_at)  # fmt: skip
    audit.accepting_again_s, audit.refused_meanwhile = prober.accepting_again_s, prober.refused
    return audit


def listened(underway: Underway, audit: Audit) -> str:
    """Stop the listeners once their jobs ended; count as a problem any segment heard before its kept write; return
    what they and the service's confirmations came to, for the notes."""
    early = 0
    for listener in underway.listeners:
        listener.stop(15)
        found = heard_before_kept(underway.stack.redis, listener)
        if found or listener.final != "done":
            early += bool(found)
            audit.problems.append(f"job {listener.job_id}: heard segments {found} before their kept write; its "
                                  f"stream ended {listener.final!r}")  # fmt: skip
    breaks = sum(listener.breaks for listener in underway.listeners)
    logs = "".join(log.read_text(errors="replace") for log in underway.stack.workdir.glob("worker-*.log"))
    refused = logs.count("NoReplicasError")  # a segment's write the old primary itself refused
    unconfirmed = len(re.findall(UNCONFIRMED, logs))  # one it took, but no replica (of the primary) confirmed
    held_back = int(_unconfirmed() - underway.unconfirmed_before)
    return (
        f"{len(underway.listeners)} listeners: {early} heard a segment before its kept write, {breaks} reconnects; "
        f"held back unconfirmed: {held_back} API answers, {unconfirmed} worker writes; {refused} worker writes "
        "refused (NOREPLICAS)"
    )


def conclude_followed(audit: Audit, stack: Stack, prober: Prober | None = None) -> None:
    """Conclude as every scenario does, and insist that the workers followed the failover without a restart and
    that callers meanwhile got 202, or 503 with Retry-After, and nothing else."""
    exits = ", ".join(f"a worker exited {code}" for _, code in stack.exits)
    audit.notes += f"; {exits or 'no worker restarted'}"
    conclude(audit, stack)
    assert not stack.exits, f"a worker had to be restarted to follow the failover: {audit.notes}"
    assert prober is None or not prober.other, f"answers other than 202 or 503 with Retry-After: {prober.other}"


def _writes_applied(node: redis.Redis) -> int:
    """Return how many changes a data node has made to its data since it started, less the keys it expired
    (INFO's changes since the last save: this configuration never saves a snapshot)."""
    info = node.info()
    return int(info["rdb_changes_since_last_save"]) - int(info["expired_keys"])


def test_the_primary_killed_mid_work_fails_over_and_loses_nothing(make_stack: MakeStack) -> None:
    underway = _underway(make_stack)
    old = underway.group.primary()
    fault_at, prober = time.time(), Prober(underway.stack)
    old.kill()
    prober.start()
    promoted_s = underway.group.wait_new_primary(old.port)
    prober.join(ANSWERS_WITHIN_S + 5)
    audit = run_with(prober, "l1. Sentinel: primary SIGKILL", underway, fault_at)
    audit.notes = (f"killed at {underway.progress}; a replica promoted after {promoted_s:.1f} s; the old primary "
                   f"stays down; {listened(underway, audit)}")  # fmt: skip
    conclude_followed(audit, underway.stack, prober)
    assert prober.accepting_again_s is not None and prober.accepting_again_s <= ANSWERS_WITHIN_S, audit.row()
    assert audit.recovery_s is not None and audit.recovery_s <= DONE_WITHIN_S, audit.row()


@pytest.mark.failover_more
def test_a_primary_frozen_past_the_failover_comes_back_stale_and_loses_nothing(make_stack: MakeStack) -> None:
    underway = _underway(make_stack)
    old = underway.group.primary()
    stale = underway.group.client(old.port)
    fault_at, prober = time.time(), Prober(underway.stack)
    applied_before = _writes_applied(stale)  # the few writes between this read and the freeze count as stale
    old.pause()
    prober.start()
    promoted_s = underway.group.wait_new_primary(old.port)
    old.resume()
    demoted_after, applied_while_stale = time.monotonic(), 0
    while stale.info("replication")["role"] == "master":
        applied_while_stale = _writes_applied(stale) - applied_before
        assert time.monotonic() - demoted_after < 30, "the Sentinels never turned the stale primary into a replica"
        time.sleep(0.02)
    demoted_s = time.monotonic() - demoted_after
    prober.join(60)
    audit = run_with(prober, "l2. Sentinel: primary SIGSTOP past the failover, resumed", underway, fault_at)
    # What it applied are commands its clients sent before or while it froze: it runs them as it wakes, before it
    # counts its replicas again. They are lost with its data when it becomes a replica; the audit shows that
    # nothing a caller was promised went with them (the janitor re-made any segment the new primary lacked).
    audit.notes = (f"frozen at {underway.progress}; a replica promoted after {promoted_s:.1f} s; resumed then, it "
                   f"applied {applied_while_stale} writes queued while frozen, then refused writes until made a "
                   f"replica {demoted_s:.1f} s later; {listened(underway, audit)}")  # fmt: skip
    conclude_followed(audit, underway.stack, prober)


@pytest.mark.failover_more
def test_a_sentinel_killed_mid_work_changes_nothing(make_stack: MakeStack) -> None:
    underway = _underway(make_stack)
    stack, group = underway.stack, underway.group
    primary = group.primary_port()
    fault_at = time.time()
    group.kill_sentinel(group.sentinel_ports[0])
    after = submit(stack, workload(jobs=3, first_seed=200))  # the service takes jobs on, as if nothing happened
    audit = run_to_end(stack, "l3. Sentinel: one Sentinel SIGKILL", underway.job_ids + after, underway.started,
                       fault_at=fault_at)  # fmt: skip
    assert group.primary_port() == primary, "losing one Sentinel of three moved the primary"
    audit.accepting_again_s, audit.refused_meanwhile = 0.0, 0
    audit.notes = (f"killed at {underway.progress}; 3 more jobs accepted after it, each at once; the primary "
                   f"stayed; {listened(underway, audit)}")  # fmt: skip
    conclude_followed(audit, stack)
