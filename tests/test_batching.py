"""The batcher groups concurrent segments by model and length, and never leaves a caller hanging."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest

from core.errors import SynthesisError
from core.policy import BatchTiming
from core.registry import ModelSpec
from core.schedule import priority_step
from tests.support.processes import wait_for
from workers import batcher as batcher_module
from workers.batcher import JOIN_SPAN, Batcher, _Running
from workers.engines.base import RateFragment, RateReady, SynthesisRequest, Waveform
from workers.planner import BatchPlanner, Pending, compatible

SPEC = ModelSpec(name="m", engine="espeak")
OTHER = ModelSpec(name="other", engine="espeak")


def test_texts_of_similar_length_are_compatible_and_very_different_ones_are_not() -> None:
    assert compatible(20, 30, max_ratio=1.5)
    assert compatible(3, 10, max_ratio=1.5), "very short texts are not split for a handful of characters"
    assert not compatible(24, 120, max_ratio=1.5)


def _pending(text: str, deadline: float) -> Pending:
    return Pending(SPEC, SynthesisRequest(text=text), deadline)


def test_a_batch_is_the_earliest_deadline_and_the_similar_lengths_due_soonest_after_it() -> None:
    batcher = Batcher(RecordingEngine(), max_batch=3, max_wait_s=0.0, timing=BatchTiming(horizon_s=100))
    items = [
        _pending("x" * 100, 5.0),  # long: not with a short head
        _pending("x" * 20, 9.0),
        _pending("x" * 22, 1.0),  # the head
        _pending("x" * 21, 3.0),
        _pending("x" * 19, 4.0),
        _pending("x" * 20, 500.0),  # beyond the horizon
    ]
    group = batcher.choose(items)
    assert [p.due for p in group] == [1.0, 3.0, 4.0]


def test_a_batch_takes_no_segment_due_beyond_the_horizon() -> None:
    batcher = Batcher(RecordingEngine(), max_batch=8, max_wait_s=0.0, timing=BatchTiming(horizon_s=10))
    group = batcher.choose([_pending("abc", 0.0), _pending("abd", 9.0), _pending("abe", 11.0)])
    assert [p.due for p in group] == [0.0, 9.0]


def test_a_head_that_must_start_now_takes_only_company_nearly_as_urgent() -> None:
    timing = BatchTiming(horizon_s=30, urgent_horizon_s=2)
    planner = BatchPlanner(max_batch=8, max_ratio=1.5, timing=timing, clock=lambda: 100.0)
    urgent, _ = planner.plan([_pending("abc", 100.0), _pending("abd", 101.5), _pending("abe", 105.0)])
    assert [p.due for p in urgent] == [100.0, 101.5], "work due in 5 s waits for a batch of its own"
    relaxed, _ = planner.plan([_pending("abc", 150.0), _pending("abd", 160.0), _pending("abe", 185.0)])
    assert [p.due for p in relaxed] == [150.0, 160.0], "a head with slack fills its batch up to the full horizon"


def test_behind_by_more_than_a_batch_an_urgent_head_fills_its_batch_to_the_full_horizon() -> None:
    timing = BatchTiming(horizon_s=30, urgent_horizon_s=2)
    planner = BatchPlanner(max_batch=2, max_ratio=1.5, timing=timing, clock=lambda: 100.0)
    backlog = [_pending("abc", 100.0), _pending("abd", 105.0), _pending("abe", 106.0)]
    assert [p.due for p in planner.plan(backlog)[0]] == [100.0, 105.0], "full batches when the engines are behind"


def test_a_head_already_later_than_a_call_fills_its_batch_to_the_full_horizon() -> None:
    timing = BatchTiming(horizon_s=30, urgent_horizon_s=2)
    planner = BatchPlanner(max_batch=8, max_ratio=1.5, timing=timing, clock=lambda: 100.0)
    planner.ran([_pending("abc", 0.0)], elapsed=1.5)  # a call of this model lasts 1.5 s
    late = [_pending("abc", 90.0), _pending("abd", 95.0), _pending("abe", 99.5)]
    assert len(planner.plan(list(late))[0]) == 3, "10 s late: the engines are behind, so the batch fills"
    due_now = [_pending("abc", 99.0), _pending("abd", 104.0)]
    assert len(planner.plan(list(due_now))[0]) == 1, "1 s late: only company nearly as urgent"


def test_the_urgent_horizon_counts_from_the_models_own_call_time() -> None:
    timing = BatchTiming(horizon_s=30, urgent_horizon_s=2)
    planner = BatchPlanner(max_batch=8, max_ratio=1.5, timing=timing, clock=lambda: 100.0)
    items = [_pending("abc", 101.0), _pending("abd", 110.0)]
    assert len(planner.plan(list(items))[0]) == 2, "due in 1 s with no call measured yet: it has slack"
    planner.ran([_pending("abc", 0.0)], elapsed=1.5)  # a call of this model lasts 1.5 s
    assert len(planner.plan(list(items))[0]) == 1, "due within one call: it must start now, alone"


def test_segments_join_running_calls_only_while_at_most_a_batch_of_them_must_start_now() -> None:
    planner = BatchPlanner(max_batch=2, max_ratio=1.5, timing=BatchTiming(), clock=lambda: 100.0)
    later = [_pending("abf", 150.0), _pending("abg", 160.0), _pending("abh", 170.0)]  # work with slack waiting
    two = [_pending("abc", 100.0), _pending("abd", 99.0)]
    assert [p.due for p in planner.joinable([*two, *later])] == [99.0, 100.0], "only the urgent, most urgent first"
    assert planner.joinable([*two, _pending("abe", 100.0), *later]) == [], (
        "three must start now and a batch holds two: the next call to end starts a full batch of them anyway"
    )


def test_a_call_still_making_a_playing_streams_nearly_due_segment_takes_no_joiners() -> None:
    planner = BatchPlanner(max_batch=8, max_ratio=1.5, timing=BatchTiming(), clock=lambda: 100.0)
    planner.ran([_pending("abc", 0.0)], elapsed=1.5)  # a call of this model lasts 1.5 s
    first = _pending("abc", 99.0)  # a job's first segment, already late: its listener has not started
    playing_soon, playing_later = (
        Pending(SPEC, SynthesisRequest(text="abd"), due, early=True) for due in (101.0, 102.0)
    )
    assert not planner.can_slow([first, playing_soon]), "due within one call: joiners would make its listener stall"
    assert planner.can_slow([first, playing_later]), "more than a call of slack: it can afford them"
    assert planner.can_slow([first]) and planner.can_slow([])


def test_a_jobs_later_segment_goes_ahead_of_first_segments_only_once_its_listener_plays() -> None:
    # Calls as long as a real-size model's (6 s): a stream's next segment is ordered two calls (12 s) early.
    planner = BatchPlanner(max_batch=1, max_ratio=1.5, timing=BatchTiming(lead=2.0), clock=lambda: 100.0)
    planner.ran([_pending("abc", 0.0)], elapsed=6.0)
    playing = {"now": False}
    own_first = _pending("the first", 100.0)  # due now: its listener waits for it
    others_first = _pending("other first", 101.0)  # another job's, due in 1 s
    # The job's second segment, due when its first has played (2 s after it arrives).
    second = Pending(SPEC, SynthesisRequest(text="the second"), 102.0, early=lambda: playing["now"])
    waiting = [second, others_first, own_first]
    assert planner.plan(list(waiting))[0] == [own_first], "before its first arrives, it stalls no one"
    assert planner.plan([second, others_first])[0] == [others_first], "nor goes before another job's first"
    playing["now"] = True  # its first segment arrived: its listener plays
    assert planner.plan(list(waiting))[0] == [second], "now it must be made before its listener runs out"
    assert not planner.can_slow([second]), "and a call making it takes no joiners"


class RecordingEngine:
    """Stand-in engine call that records batch sizes and returns len(text) samples per item."""

    def __init__(self, delay_s: float = 0.05, fail: bool = False, short_by: int = 0) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.delay_s = delay_s
        self.fail = fail
        self.short_by = short_by
        self.lock = threading.Lock()

    def __call__(
        self,
        spec: ModelSpec,
        batch: list[SynthesisRequest],
        replica: int = 0,
        *,
        ready: RateReady | None = None,
        fragment: RateFragment | None = None,
    ) -> tuple[list[Waveform], int]:
        with self.lock:
            self.calls.append((spec.name, [r.text for r in batch]))
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("engine exploded")
        waves = [np.full(len(r.text), 0.1, dtype=np.float32) for r in batch]
        return waves[: len(waves) - self.short_by], 16000


def _submit_concurrently(batcher: Batcher, specs_and_texts: list[tuple[ModelSpec, str]]) -> list[object]:
    with ThreadPoolExecutor(len(specs_and_texts)) as pool:
        futures = [
            pool.submit(lambda st: batcher.submit(st[0], SynthesisRequest(text=st[1])).result(5), st)
            for st in specs_and_texts
        ]
        results = []
        for f in futures:
            try:
                results.append(f.result())
            except Exception as e:
                results.append(e)
        return results


def test_concurrent_segments_of_one_model_share_an_engine_call() -> None:
    engine = RecordingEngine()
    batcher = Batcher(engine, max_batch=16, max_wait_s=0.05)
    texts = [f"sentence number {i:02d}" for i in range(16)]
    results = _submit_concurrently(batcher, [(SPEC, t) for t in texts])
    for text, (wave, rate) in zip(texts, results, strict=True):  # type: ignore[misc]
        assert len(wave) == len(text) and rate == 16000
    assert len(engine.calls) <= 3
    assert batcher.mean_batch_size() >= 5


def test_different_models_never_share_a_call() -> None:
    engine = RecordingEngine()
    batcher = Batcher(engine, max_batch=16, max_wait_s=0.05)
    _submit_concurrently(batcher, [(SPEC if i % 2 else OTHER, f"text {i}") for i in range(8)])
    for name, texts in engine.calls:
        expected_parity = 1 if name == "m" else 0
        assert all(int(t.split()[1]) % 2 == expected_parity for t in texts)


def test_a_failed_call_fails_every_segment_in_it_and_none_hangs() -> None:
    batcher = Batcher(RecordingEngine(fail=True), max_batch=8, max_wait_s=0.05)
    results = _submit_concurrently(batcher, [(SPEC, f"t{i}") for i in range(6)])
    assert all(isinstance(r, RuntimeError) and "exploded" in str(r) for r in results)


def test_a_call_that_returns_too_few_waveforms_fails_the_batch() -> None:
    batcher = Batcher(RecordingEngine(short_by=1), max_batch=8, max_wait_s=0.05)
    results = _submit_concurrently(batcher, [(SPEC, f"t{i}") for i in range(4)])
    assert all(isinstance(r, SynthesisError) and "waveforms for" in str(r) for r in results)


def test_a_failing_observer_neither_fails_the_batch_nor_stops_the_batcher() -> None:
    def broken_observer(*_: object) -> None:
        raise TypeError("observer bug")

    batcher = Batcher(RecordingEngine(), max_batch=4, max_wait_s=0.01, observe=broken_observer)
    first = _submit_concurrently(batcher, [(SPEC, "one"), (SPEC, "two")])
    second = _submit_concurrently(batcher, [(SPEC, "three")])
    assert all(not isinstance(r, Exception) for r in [*first, *second])


def test_segments_enter_the_broker_at_the_step_their_slack_earns() -> None:
    from celery_config import queue_keys

    now = 1000.0
    assert [priority_step(now + slack, now) for slack in (-5, 0.5, 5, 30, 600)] == [0, 0, 3, 6, 9]
    assert queue_keys("realtime")[0] == "realtime" and len(queue_keys("realtime")) == 4


def test_a_due_first_segment_overtakes_queued_later_segments_of_other_jobs() -> None:
    engine = RecordingEngine(delay_s=0.2)
    batcher = Batcher(engine, max_batch=2, max_wait_s=0.0)
    now = time.time()
    blocker = batcher.submit(SPEC, SynthesisRequest(text="keeps the engine busy"), deadline=now)
    wait_for(lambda: engine.calls, 5, "the blocker's engine call started")
    later = [batcher.submit(SPEC, SynthesisRequest(text=f"later segment {i}"), deadline=now + 10 + i) for i in range(4)]
    first = batcher.submit(SPEC, SynthesisRequest(text="first segment"), deadline=time.time())
    for future in (blocker, first, *later):
        future.result(5)
    assert "first segment" in engine.calls[1][1], engine.calls


def test_with_no_deadlines_segments_run_in_arrival_order() -> None:
    engine = RecordingEngine(delay_s=0.1)
    batcher = Batcher(engine, max_batch=1, max_wait_s=0.0)
    futures = []
    for i in range(4):
        futures.append(batcher.submit(SPEC, SynthesisRequest(text=f"segment {i}")))
    for future in futures:
        future.result(5)
    assert [texts for _, texts in engine.calls] == [[f"segment {i}"] for i in range(4)]


def test_a_slack_segment_is_not_starved_by_a_flood_of_due_ones() -> None:
    """Due segments arrive five times faster than the engine works; the slack one still runs, in deadline order."""
    engine = RecordingEngine(delay_s=0.02)
    batcher = Batcher(engine, max_batch=1, max_wait_s=0.0)
    stop = threading.Event()
    flooded: list[float] = []
    waiting: list[Future[tuple[Waveform, int]]] = []

    def flood() -> None:
        while not stop.is_set():
            now = time.time()
            waiting.append(batcher.submit(SPEC, SynthesisRequest(text=f"{now:.6f}"), deadline=now))  # due at once
            flooded.append(now)
            time.sleep(0.004)  # the flood's pace, not a synchronisation

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        wait_for(lambda: len(flooded) >= 10 and len(engine.calls) >= 2, 5, "the flood is under way")
        deadline = time.time() + 0.3
        batcher.submit(SPEC, SynthesisRequest(text="slack"), deadline=deadline).result(10)
        submitted_by_then = len(flooded)
        # The flood went on after the slack segment was served: it did not have to wait for the flood to end.
        wait_for(lambda: len(flooded) > submitted_by_then + 5, 5, "the flood goes on after the slack segment")
        assert flooder.is_alive(), "the flood ran throughout"
        wait_for(lambda: len(engine.calls) > [t[0] for _, t in engine.calls].index("slack") + 2, 5, "flood after it")
    finally:
        stop.set()
        flooder.join(5)
        for future in waiting:  # the flood's callers give up: the dispatcher need not make the rest after the test
            future.cancel()
        batcher.close()
    order = [texts[0] for _, texts in engine.calls]
    position = order.index("slack")
    assert all(float(t) <= deadline for t in order[:position]), "only work due earlier went first"
    assert len(order) > position + 1 and all(float(t) >= deadline - 0.01 for t in order[position + 1 :])


def test_a_segment_with_slack_waits_for_company_and_a_due_one_does_not() -> None:
    engine = RecordingEngine(delay_s=0.01)
    batcher = Batcher(engine, max_batch=4, max_wait_s=0.0, timing=BatchTiming(hold_s=0.3))
    now = time.time()
    first = batcher.submit(SPEC, SynthesisRequest(text="slack one"), deadline=now + 30)
    wait_for(lambda: batcher.holds >= 1, 5, "the slack segment is held for company")
    second = batcher.submit(SPEC, SynthesisRequest(text="slack two"), deadline=now + 31)
    first.result(5), second.result(5)
    assert engine.calls[0][1] == ["slack one", "slack two"], "the slack segment held for a fuller batch"
    started = time.monotonic()
    batcher.submit(SPEC, SynthesisRequest(text="due now")).result(5)
    assert time.monotonic() - started < 0.25, "a due segment does not wait for the hold"
    assert batcher.holds >= 1


def test_with_two_replicas_two_batches_run_side_by_side() -> None:
    engine = RecordingEngine(delay_s=0.3)
    replicas: list[int] = []
    batcher = Batcher(
        lambda spec, batch, replica, ready=None, fragment=None: (replicas.append(replica), engine(spec, batch))[1],
        max_batch=1,
        max_wait_s=0.0,
        replicas=2,
    )
    started = time.monotonic()
    futures = [batcher.submit(SPEC, SynthesisRequest(text=f"segment {i}")) for i in range(4)]
    for future in futures:
        future.result(5)
    assert time.monotonic() - started < 1.0, "four 0.3 s calls on two replicas take two rounds, not four"
    assert sorted(replicas) == [0, 0, 1, 1]


def test_a_deadline_that_cannot_be_computed_neither_stops_the_batcher_nor_its_segment() -> None:
    """A job can vanish (expired, deleted) while its segment waits; its deadline then fails to compute."""

    def vanished() -> float:
        raise IndexError("list index out of range")

    engine = RecordingEngine()
    batcher = Batcher(engine, max_batch=4, max_wait_s=0.01)
    orphan = batcher.submit(SPEC, SynthesisRequest(text="its job is gone"), deadline=vanished)
    assert len(orphan.result(5)[0]) == len("its job is gone"), "served as due at once"
    after = [batcher.submit(SPEC, SynthesisRequest(text=f"next {i}")) for i in range(3)]
    assert all(len(f.result(5)[0]) == len(f"next {i}") for i, f in enumerate(after)), "the batcher still serves"


def test_an_unexpected_fault_in_a_round_fails_that_round_and_the_batcher_goes_on() -> None:
    class FaultyPlanner(BatchPlanner):
        broken = True

        def plan(self, items: list[Pending]) -> tuple[list[Pending], float]:
            if self.broken:
                self.broken = False
                raise ValueError("planner bug")
            return super().plan(items)

    batcher = Batcher(RecordingEngine(), max_batch=4, max_wait_s=0.0)
    batcher.planner = FaultyPlanner(max_batch=4, max_ratio=1.5, timing=BatchTiming())
    first = batcher.submit(SPEC, SynthesisRequest(text="caught in the fault"))
    try:
        first.result(5)
    except ValueError as e:
        assert "planner bug" in str(e)
    else:
        raise AssertionError("the round that failed should fail its segments, not drop them")
    assert len(batcher.submit(SPEC, SynthesisRequest(text="later")).result(5)[0]) == len("later")


def test_a_first_segment_gains_priority_as_it_waits_and_none_while_it_has_not() -> None:
    engine = RecordingEngine(delay_s=0.4)  # the blocker's call outlasts the four submissions
    batcher = Batcher(engine, max_batch=1, max_wait_s=0.0, timing=BatchTiming(first_priority_s=2.0))
    now = time.time()
    blocker = batcher.submit(SPEC, SynthesisRequest(text="keeps the engine busy"), deadline=now)
    wait_for(lambda: engine.calls, 5, "the blocker's engine call started")
    # Late by 1.5 s (its listener has waited that long): it goes before a stream's segment due 1 s before it.
    stream = batcher.submit(SPEC, SynthesisRequest(text="a stream's next"), deadline=now - 2.5, early=True)
    waiting = batcher.submit(SPEC, SynthesisRequest(text="a waiting listener's first"), deadline=now - 1.5)
    # Due in 1.5 s, not late yet: no priority (a fixed 2 s would put it first), so a stream's segment goes first.
    fresh = batcher.submit(SPEC, SynthesisRequest(text="a new listener's first"), deadline=now + 1.5)
    other = batcher.submit(SPEC, SynthesisRequest(text="another stream's next"), deadline=now + 0.2, early=True)
    for future in (blocker, stream, waiting, fresh, other):
        future.result(5)
    order = [texts[0] for _, texts in engine.calls[1:]]
    assert order == ["a waiting listener's first", "a stream's next", "another stream's next", "a new listener's first"]


def test_a_segment_gets_its_audio_when_it_is_made_not_when_its_whole_batch_is() -> None:
    handed_over, release = threading.Event(), threading.Event()

    def engine(
        spec: ModelSpec,
        batch: list[SynthesisRequest],
        replica: int = 0,
        *,
        ready: RateReady | None = None,
        fragment: RateFragment | None = None,
    ) -> tuple[list[Waveform], int]:
        waves = [np.full(len(r.text), 0.1, dtype=np.float32) for r in batch]
        assert ready is not None
        ready(1, waves[1], 16000)  # the short one is made; the long one is still being made
        handed_over.set()
        assert release.wait(10), "the test never saw the short segment's audio"
        return waves, 16000

    batcher = Batcher(engine, max_batch=2, max_wait_s=0.5)
    try:
        long = batcher.submit(SPEC, SynthesisRequest(text="a longer segment"))
        short = batcher.submit(SPEC, SynthesisRequest(text="short one"))
        assert handed_over.wait(10)
        wave, rate = short.result(timeout=5)
        assert len(wave) == len("short one") and rate == 16000
        assert not long.done(), "the long segment's call has not returned"
        release.set()
        assert len(long.result(timeout=5)[0]) == len("a longer segment")
    finally:
        release.set()
        batcher.close()


def test_a_call_takes_joiners_past_its_own_segments_for_its_join_span_while_nothing_else_waits() -> None:
    started = time.perf_counter() - 3.0  # the call started 3 s ago
    first, joiner = _pending("started with", 1.0), _pending("joined", 2.0)
    call = _Running([first], started)
    call.joined.append(joiner)
    assert call.joinable(), "what it started with is still being made"
    first.future.set_result((np.zeros(1, dtype=np.float32), 16000))
    first.made = started + 3.0 / JOIN_SPAN - 0.5  # its segments took a little under a third of the time so far
    assert not call.joinable(), "past JOIN_SPAN times what its own segments took: it is left to end"
    first.made = started + 3.0 / JOIN_SPAN + 0.5
    assert call.joinable(), "within the span, while a joiner is still being made, rows that end are replaced"
    assert not call.joinable(extend=False), "not while another segment waits for a replica: it would wait for this"
    joiner.future.set_result((np.zeros(1, dtype=np.float32), 16000))
    assert not call.joinable(), "nothing left being made: the call is ending"
    refused = _Running([_pending("still being made", 1.0)], started)
    refused.open = False  # a host refused an offer: the call is ending
    assert not refused.joinable()


def test_a_call_whose_own_segments_were_all_canceled_takes_no_joiners() -> None:
    canceled = _pending("gone", 1.0)
    canceled.future.cancel()
    call = _Running([canceled], time.perf_counter())
    call.joined.append(_pending("joined", 2.0))
    assert not call.joinable()


@pytest.mark.parametrize("another_waits", [False, True])
def test_a_call_past_its_own_segments_takes_an_urgent_joiner_only_while_no_other_segment_waits_for_a_replica(
    monkeypatch: pytest.MonkeyPatch, another_waits: bool
) -> None:
    monkeypatch.setattr(batcher_module, "JOIN_SPAN", 1e6)  # the span is not what this test is about
    asked: list[bool] = []  # how the dispatcher asked the running call whether it takes joiners (extend or not)
    joinable = _Running.joinable

    def recorded(call: _Running, *, extend: bool = True) -> bool:
        asked.append(extend)
        return joinable(call, extend=extend)

    monkeypatch.setattr(_Running, "joinable", recorded)
    joined, release = threading.Event(), threading.Event()
    offers: list[str] = []

    def engine(
        spec: ModelSpec,
        batch: list[SynthesisRequest],
        replica: int = 0,
        *,
        ready: RateReady | None = None,
        fragment: RateFragment | None = None,
    ) -> tuple[list[Waveform], int]:
        waves = [np.zeros(4, dtype=np.float32) for _ in batch]
        if batch[0].text == "started the call":  # makes its own segment once a joiner is in, then runs on with it
            assert ready is not None and joined.wait(10)
            time.sleep(0.01)  # it took a moment: the span is counted from that
            ready(0, waves[0], 16000)
            assert release.wait(10)
        return waves, 16000

    def join(
        spec: ModelSpec,
        requests: list[SynthesisRequest],
        replica: int,
        *,
        ready: RateReady,
        fragment: RateFragment | None = None,
    ) -> Future[bool]:
        offers.extend(r.text for r in requests)
        answer: Future[bool] = Future()
        answer.set_result(len(offers) == 1)  # the first joiner is taken (and still being made); later ones refused
        joined.set()
        return answer

    batcher = Batcher(engine, max_batch=8, max_wait_s=0.0, timing=BatchTiming(hold_s=0), join_batch=join)
    try:
        batcher.submit(SPEC, SynthesisRequest(text="started the call"))
        wait_for(lambda: batcher._running, 10, "the call running")
        batcher.submit(SPEC, SynthesisRequest(text="joined it"), deadline=time.time() - 1)
        wait_for(lambda: offers == ["joined it"], 10, "the first joiner taken")
        wait_for(lambda: all(p.future.done() for c in batcher._running.values() for p in c.group), 10, "own made")
        asked.clear()
        waiting = []
        if another_waits:  # a job's later segment, not due yet: it waits for a replica to free
            waiting.append(batcher.submit(SPEC, SynthesisRequest(text="a later segment"), deadline=time.time() + 1))
        waiting.append(batcher.submit(SPEC, SynthesisRequest(text="a first segment"), deadline=time.time() - 1))
        if another_waits:
            wait_for(lambda: False in asked, 10, "the dispatcher asking the running call, another segment waiting")
            assert offers == ["joined it"], "a call past its own segments is left to end while another one waits"
        else:
            wait_for(lambda: offers[1:] == ["a first segment"], 10, "the urgent segment offered to the call")
            assert False not in asked, "asked to extend: nothing else waited"
        release.set()
        for future in waiting:  # the call ended: what waited is made in the next one
            future.result(10)
    finally:
        release.set()
        batcher.close()


def test_a_call_running_alone_gets_every_core_and_calls_side_by_side_share_them() -> None:
    shares: list[tuple[int, int]] = []
    started = threading.Barrier(2, timeout=5)

    def engine(
        spec: ModelSpec, batch: list[SynthesisRequest], replica: int = 0, **_: object
    ) -> tuple[list[Waveform], int]:
        if batch[0].text.startswith("pair"):
            started.wait()
        return [np.zeros(4, dtype=np.float32) for _ in batch], 16000

    batcher = Batcher(engine, max_batch=1, max_wait_s=0.0, replicas=2, cores=2,
                      share_cores=lambda spec, replica, threads: shares.append((replica, threads)))  # fmt: skip
    batcher.submit(SPEC, SynthesisRequest(text="alone")).result(5)
    assert shares[0][1] == 2, "alone, a call takes both cores"
    shares.clear()
    both = [batcher.submit(SPEC, SynthesisRequest(text=f"pair {i}")) for i in range(2)]
    for future in both:
        future.result(5)
    assert (0, 1) in shares and (1, 1) in shares, "side by side, each has one"
    batcher.close()
