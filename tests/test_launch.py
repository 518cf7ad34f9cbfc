"""The launcher keeps one worker per slot, and `make run` (scripts/run.sh under supervisord) heals itself."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.processes import alive, children, cmdline, environ, wait_for
from tests.support.run_script import RunScript, readyz, supervisorctl_or_skip
from tests.support.servers import ROOT
from workers.launch import BACKOFF_MAX_S, build_slots, next_backoff, parse_args

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes through /proc")

SLEEPER = "import time; time.sleep(600)"
# Exits 0 on SIGTERM, as a worker's warm shutdown does; says "armed" once it would.
GRACEFUL_SLEEPER = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
    "print('armed', flush=True); time.sleep(600)"
)


@contextmanager
def launcher(
    tmp_path: Path, child_code: str, devices: int = 2, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """Run `python -m workers.launch` over stand-in children; SIGKILL it (and so them) at the end."""
    log_path = tmp_path / "launch.log"
    command = shlex.join([sys.executable, "-c", child_code])
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "workers.launch", "--fake-devices", str(devices), "--worker-command", command],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )  # fmt: skip
    try:
        yield process, log_path
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def slots(launcher_pid: int, child_code: str) -> dict[str, list[int]]:
    """Return the launcher's started children by slot (their CUDA_VISIBLE_DEVICES), refusing two in one slot."""
    by_slot: dict[str, list[int]] = {}
    for pid in children(launcher_pid):
        if child_code in cmdline(pid):  # started: past the fork, running the child's own program
            by_slot.setdefault(environ(pid).get("CUDA_VISIBLE_DEVICES", "?"), []).append(pid)
    assert all(len(pids) == 1 for pids in by_slot.values()), f"two workers in one slot: {by_slot}"
    return by_slot


def full(launcher_pid: int, child_code: str, count: int = 2) -> dict[str, list[int]] | None:
    """Return the launcher's children by slot once every slot has one, else None."""
    by_slot = slots(launcher_pid, child_code)
    return by_slot if len(by_slot) == count else None


def test_the_restart_backoff_doubles_up_to_30_s_and_starts_again_after_a_minute_up() -> None:
    delays = [1.0]
    for _ in range(7):
        delays.append(next_backoff(delays[-1], uptime_s=2))
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert next_backoff(BACKOFF_MAX_S, uptime_s=60) == 1
    assert next_backoff(0, uptime_s=0) == 1


def test_a_killed_worker_is_restarted_in_its_own_slot_with_a_log_line(tmp_path: Path) -> None:
    with launcher(tmp_path, SLEEPER) as (process, log_path):
        before = wait_for(lambda: full(process.pid, SLEEPER), 30, "two workers")
        victim = before["0"][0]
        os.kill(victim, signal.SIGKILL)

        def replaced() -> dict[str, list[int]] | None:
            now = full(process.pid, SLEEPER)
            return now if now and now["0"] != [victim] else None

        after = wait_for(replaced, 30, "slot 0 restarted")
        assert after["1"] == before["1"]  # the other slot's worker was left alone
        assert alive(process.pid)
        wait_for(lambda: "restarted as pid" in log_path.read_text(), 10, "restart logged")
        log = log_path.read_text()
        assert f"worker in slot 0 (pid {victim}) killed by SIGKILL; restarting it in 1 s" in log
        assert f"worker in slot 0 restarted as pid {after['0'][0]}" in log


def test_the_one_layout_starts_a_single_worker_with_a_model_host_on_each_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TTS_MODEL_REPLICAS", raising=False)  # unset: the layout gives a host per device
    layout = {"TTS_WORKER_LAYOUT": "one"}
    with launcher(tmp_path, SLEEPER, devices=3, env=layout) as (process, _):
        only = wait_for(lambda: full(process.pid, SLEEPER, count=1), 30, "one worker")
        [worker] = only["0,1,2"]
        seen = environ(worker)
        assert (seen["TTS_DEVICE"], seen["TTS_MODEL_REPLICAS"]) == ("cpu,cpu,cpu", "3")
        assert len(slots(process.pid, SLEEPER)) == 1


def test_the_one_layout_names_the_visible_gpus_in_order_and_keeps_a_replica_count_that_was_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TTS_MODEL_REPLICAS", raising=False)
    [slot] = build_slots(parse_args(["--devices", "2,5", "--layout", "one"]))
    assert slot.env["CUDA_VISIBLE_DEVICES"] == "2,5"  # inside the worker they are cuda:0 and cuda:1
    assert (slot.env["TTS_DEVICE"], slot.env["TTS_MODEL_REPLICAS"]) == ("cuda:0,cuda:1", "2")
    monkeypatch.setenv("TTS_MODEL_REPLICAS", "4")
    [slot] = build_slots(parse_args(["--devices", "2,5", "--layout", "one"]))
    assert "TTS_MODEL_REPLICAS" not in slot.env, "a count the operator set is theirs: 4 hosts over the 2 GPUs"
    per_device = build_slots(parse_args(["--devices", "2,5"]))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in per_device] == ["2", "5"]


def test_a_device_the_operator_names_in_tts_device_is_used_by_one_unpinned_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # a machine showing two GPUs
    monkeypatch.setenv("TTS_METRICS_PORT", "9400")
    monkeypatch.setenv("TTS_DEVICE", "cpu")
    [slot] = build_slots(parse_args([]))
    assert slot.env == {"TTS_DEVICE": "cpu", "TTS_METRICS_PORT": "9400"}, "not pinned to a GPU: on the CPU"
    monkeypatch.setenv("TTS_DEVICE", "cuda:1")
    [slot] = build_slots(parse_args([]))
    assert slot.env["TTS_DEVICE"] == "cuda:1" and "CUDA_VISIBLE_DEVICES" not in slot.env
    monkeypatch.setenv("TTS_DEVICE", "auto")
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in build_slots(parse_args([]))] == ["0", "1"], "auto: one per GPU"
    monkeypatch.setenv("TTS_DEVICE", "cpu")
    assert len(build_slots(parse_args(["--devices", "0,1"]))) == 2, "devices asked for on the command line win"


@pytest.mark.parametrize("port", ["nine", "70000", "-1"])
def test_a_metrics_port_that_is_not_a_port_stops_the_launcher_with_the_setting_named(
    port: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TTS_METRICS_PORT", port)
    with pytest.raises(SystemExit, match=f"TTS_METRICS_PORT: '{port}' is not a port number"):
        build_slots(parse_args(["--fake-devices", "1"]))


def test_sigterm_stops_every_worker_restarts_none_and_exits_0(tmp_path: Path) -> None:
    with launcher(tmp_path, GRACEFUL_SLEEPER) as (process, log_path):
        workers = wait_for(lambda: full(process.pid, GRACEFUL_SLEEPER), 30, "two workers")
        wait_for(lambda: log_path.read_text().count("armed") == 2, 30, "both workers armed")
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert not any(alive(pid) for pids in workers.values() for pid in pids)
        assert "restart" not in log_path.read_text()


def test_workers_die_with_a_launcher_killed_by_sigkill(tmp_path: Path) -> None:
    with launcher(tmp_path, SLEEPER) as (process, _):
        workers = wait_for(lambda: full(process.pid, SLEEPER), 30, "two workers")
        process.kill()
        process.wait(10)
        wait_for(lambda: not any(alive(pid) for pids in workers.values() for pid in pids), 10, "workers gone")


@pytest.fixture
def make_run(tmp_path: Path) -> Iterator[RunScript]:
    """Start scripts/run.sh on free ports and wait for its ready line; skip locally (fail in CI) without tools."""
    supervisorctl = supervisorctl_or_skip()
    run = RunScript(tmp_path / "run", supervisorctl)
    try:
        wait_for(lambda: "==> ready:" in run.text or run.process.poll() is not None, 120, "make run ready")
        assert run.process.poll() is None, run.text[-4000:]
        run.remember()
        yield run
    finally:
        run.close()


def kill_a_worker(run: RunScript) -> float:
    """SIGKILL the launcher's worker; check it is restarted and serving; return the seconds until it was."""
    launch = run.pid_of("worker")
    (worker,) = children(launch)
    os.kill(worker, signal.SIGKILL)
    killed_at = time.monotonic()
    (new_worker,) = wait_for(lambda: [p for p in children(launch) if p != worker], 60, "worker restarted")
    wait_for(lambda: run.served_by(new_worker), 60, "/readyz with the new worker")
    assert f"worker in slot cpu (pid {worker}) killed by SIGKILL" in run.text
    return time.monotonic() - killed_at


def kill_the_launcher(run: RunScript) -> None:
    """SIGKILL the launcher; check its worker dies with it and supervisord brings back exactly one."""
    launch = run.pid_of("worker")
    (worker,) = children(launch)
    os.kill(launch, signal.SIGKILL)
    new_launch = run.replaced("worker", launch)
    wait_for(lambda: not alive(worker), 10, "the old launcher's worker gone")
    (new_worker,) = wait_for(lambda: children(new_launch), 30, "the new launcher's worker")
    wait_for(lambda: run.served_by(new_worker), 60, "/readyz with the new launcher's worker")
    assert children(new_launch) == [new_worker]
    assert "exited: worker (terminated by SIGKILL; not expected)" in run.text
    assert f"spawned: 'worker' with pid {new_launch}" in run.text


def kill_redis(run: RunScript) -> None:
    """SIGKILL redis-server; check supervisord restarts it, says so, and the service is ready again."""
    redis_pid = run.pid_of("redis")
    os.kill(redis_pid, signal.SIGKILL)
    new_redis = run.replaced("redis", redis_pid)
    wait_for(lambda: readyz(run.api_port), 60, "/readyz after the Redis restart")
    wait_for(lambda: f"spawned: 'redis' with pid {new_redis}" in run.text, 10, "the Redis restart logged")
    assert "exited: redis (terminated by SIGKILL; not expected)" in run.text


@pytest.mark.slow
def test_make_run_restarts_a_killed_worker_launcher_and_redis_and_ctrl_c_stops_everything(make_run: RunScript) -> None:
    run = make_run
    downtime = kill_a_worker(run)
    run.remember()
    kill_the_launcher(run)
    run.remember()
    kill_redis(run)
    run.remember()

    os.killpg(run.process.pid, signal.SIGINT)
    assert run.process.wait(90) == 0, run.text[-4000:]
    run.reader.join(10)  # the pipe closes only when no process holds it any more
    assert not run.reader.is_alive(), "a process of the stack still holds run.sh's output"
    assert run.text.rstrip().endswith("==> stopped"), run.text[-2000:]
    assert [pid for pid in run.seen if alive(pid)] == []
    print(f"worker SIGKILL -> /readyz 200 with the new worker: {downtime:.1f} s")
