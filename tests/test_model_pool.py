"""The model pool runs each model in its own spawned process: on demand, LRU, idle unload, crash restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from core.registry import ModelSpec
from core.settings import SettingsInvalid, load_settings
from tests.chaos.stack import write_registry
from tests.support.processes import alive, wait_for
from tests.support.servers import ROOT
from workers.engines.base import SynthesisRequest
from workers.layout import Layout
from workers.pool.handle import ModelHost
from workers.pool.pool import ModelPool, replica_device
from workers.wiring import _model_pool

EN = ModelSpec(name="espeak-en", engine="espeak", voices={"default": ""}, options={"language": "en-us"}, memory_mb=1)
YUE = ModelSpec(name="espeak-yue", engine="espeak", voices={"default": ""}, options={"language": "yue"}, memory_mb=1)
HELLO = [SynthesisRequest(text="hello there"), SynthesisRequest(text="a second sentence")]


def _gone(pid: int | None, timeout: float = 10) -> bool:
    """Say whether the process ended (a zombie waiting to be reaped counts as ended)."""
    assert pid is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def pool() -> Iterator[ModelPool]:
    """Return a pool with a generous budget; stop every host afterwards."""
    made = ModelPool(
        lambda spec, _replica: ModelHost(spec, device="cpu"), budget_mb=100_000, idle_s=60, call_timeout_s=30
    )
    yield made
    made.close()


def test_a_model_loads_on_first_use_in_its_own_process(pool: ModelPool) -> None:
    assert pool.loaded() == []
    waves, rate = pool.synthesize(EN, HELLO)
    assert rate == 22050
    assert len(waves) == 2 and all(len(w) > 1000 for w in waves)
    pid = pool.host_pid("espeak-en")
    assert pid is not None and pid != os.getpid()
    pool.synthesize(EN, HELLO[:1])
    assert pool.counts["loads"] == 1


def test_loading_past_the_budget_evicts_the_least_recently_used_model(pool: ModelPool) -> None:
    pool.synthesize(EN, HELLO)
    first_pid = pool.host_pid("espeak-en")
    one_host = pool.used_mb()
    pool.budget_mb = one_host * 1.5  # room for one host, not two
    pool.synthesize(replace(YUE, memory_mb=int(one_host)), [SynthesisRequest(text="你好")])
    assert [m["model"] for m in pool.loaded()] == ["espeak-yue"]
    assert pool.counts["evictions"] == 1
    assert _gone(first_pid), "evicting must end the host process"


def test_pinned_models_are_never_evicted(pool: ModelPool) -> None:
    pool.synthesize(replace(EN, pinned=True), HELLO)
    one_host = pool.used_mb()
    pool.budget_mb = one_host * 1.5
    pool.synthesize(replace(YUE, memory_mb=int(one_host)), [SynthesisRequest(text="你好")])
    assert {m["model"] for m in pool.loaded()} == {"espeak-en", "espeak-yue"}
    assert pool.counts["evictions"] == 0


def test_idle_models_are_unloaded_and_pinned_ones_stay(pool: ModelPool) -> None:
    pool.synthesize(EN, HELLO)
    pool.synthesize(replace(YUE, pinned=True), [SynthesisRequest(text="你好")])
    pid = pool.host_pid("espeak-en")
    assert pool.reap_idle(now=time.monotonic() + 1) == []
    assert pool.reap_idle(now=time.monotonic() + pool.idle_s + 1, keep={"espeak-en"}) == [], "a worker's default"
    assert pool.reap_idle(now=time.monotonic() + pool.idle_s + 1) == ["espeak-en"]
    assert [m["model"] for m in pool.loaded()] == ["espeak-yue"]
    assert _gone(pid)


def test_a_killed_model_process_is_restarted_and_its_batch_still_succeeds(pool: ModelPool) -> None:
    pool.synthesize(EN, HELLO)
    pid = pool.host_pid("espeak-en")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert _gone(pid)
    waves, _ = pool.synthesize(EN, HELLO)
    assert len(waves) == 2
    assert pool.host_pid("espeak-en") not in (None, pid)
    assert pool.counts["crashes"] == 1
    assert pool.counts["loads"] == 2


def test_a_model_that_cannot_load_raises_a_load_error(pool: ModelPool, tmp_path: object) -> None:
    from workers.engines.errors import EngineLoadError

    broken = ModelSpec(name="broken", engine="espeak", voices={"default": ""}, options={"language": "no-such-voice"})
    with pytest.raises(EngineLoadError, match="broken"):
        pool.synthesize(broken, HELLO)
    assert pool.loaded() == []


def test_replicas_of_a_model_are_processes_of_their_own_and_unload_together(pool: ModelPool) -> None:
    pool.synthesize(EN, HELLO, 0)
    pool.synthesize(EN, HELLO, 1)
    first, second = pool.host_pid("espeak-en", 0), pool.host_pid("espeak-en", 1)
    assert first is not None and second is not None and first != second
    assert sorted(m["replica"] for m in pool.loaded()) == [0, 1]
    assert pool.unload("espeak-en")
    assert pool.loaded() == []


def test_replicas_take_the_devices_of_a_list_in_turn_and_every_replica_the_one_device_given() -> None:
    assert [replica_device("cuda:0, cuda:1", r) for r in range(4)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert [replica_device("cuda:1", r) for r in range(2)] == ["cuda:1", "cuda:1"]
    assert load_settings(device="cuda:0,cuda:1").device == "cuda:0,cuda:1"
    with pytest.raises(SettingsInvalid, match="TTS_DEVICE"):
        load_settings(device="cuda:0,gpu")


def test_a_worker_given_several_devices_starts_each_replica_of_a_model_on_the_next_one() -> None:
    pool = _model_pool(load_settings(device="cpu,auto", model_idle_s=60), Layout(3, 1, "as set"))
    try:
        for replica in (0, 1, 2):
            pool.synthesize(EN, HELLO, replica)
        assert {m["replica"]: m["device"] for m in pool.loaded()} == {0: "cpu", 1: "auto", 2: "cpu"}
        assert len({m["pid"] for m in pool.loaded()}) == 3
    finally:
        pool.close()


def test_a_model_host_ends_when_its_worker_is_killed_even_in_the_middle_of_a_batch(tmp_path: Path) -> None:
    registry = write_registry(tmp_path / "models.json")  # with the faulty engine, which hangs on a marker
    code = (
        "import sys, time; from core.settings import load_settings; from core.registry import load_registry; "
        "from workers.engines.base import SynthesisRequest; from workers.pool.handle import ModelHost; "
        f"settings = load_settings(models_file={str(registry)!r}, engine_plugins='tests.support.engines'); "
        "spec = load_registry(settings).get('faulty'); "
        "host = ModelHost(spec, device='cpu'); print(host.pid, flush=True); "
        "host.synthesize([SynthesisRequest(text='HANG-ME')], timeout_s=600)"
    )
    worker = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert worker.stdout is not None
        host = int(worker.stdout.readline())
        assert alive(host)
        worker.kill()  # SIGKILL, mid-batch: the worker gets no chance to stop its host
        worker.wait(10)
        wait_for(lambda: not alive(host), 5, "the orphaned host gone")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        assert worker.stdout is not None
        worker.stdout.close()


def test_a_host_hands_back_each_segment_as_it_ends_with_its_rate(pool: ModelPool, tiny_model_dir: Path) -> None:
    voices, fixed = {"default": {"speaker_seed": 2}}, {"fixed_token_budget": True}
    tiny = ModelSpec(name="chattts-tiny", engine="chattts", weights=tiny_model_dir, voices=voices, options=fixed)
    texts = ["a somewhat longer sentence, said slowly", "ok", "one of medium size"]
    told: list[tuple[int, int, int]] = []
    waves, rate = pool.synthesize(
        tiny, [SynthesisRequest(text=t) for t in texts], ready=lambda i, wave, r: told.append((i, len(wave), r))
    )
    # Shortest first: each crossed the pipe when its item ended, before the longer ones were made.
    assert [i for i, _, _ in told] == [1, 2, 0]
    assert all(r == rate == 24000 for _, _, r in told)
    assert {i: n for i, n, _ in told} == {i: len(w) for i, w in enumerate(waves)}
