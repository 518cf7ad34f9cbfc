"""`auto` picks a worker's model hosts and torch threads for the machine; a number set by the operator wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import SettingsInvalid
from core.settings import load_settings
from workers.layout import MAX_CPU_HOSTS, gpu_devices, resolve_layout, usable_cores


def test_auto_on_cpus_runs_one_one_thread_host_per_core() -> None:
    layout = resolve_layout("auto", "auto", gpus=0, cores=2)
    assert (layout.replicas, layout.torch_threads) == (2, 1)
    assert "auto" in layout.reason and "2 CPU core(s)" in layout.describe()


def test_auto_on_many_cores_caps_the_hosts_and_shares_the_cores_out_as_threads() -> None:
    layout = resolve_layout("auto", "auto", gpus=0, cores=4 * MAX_CPU_HOSTS)
    assert (layout.replicas, layout.torch_threads) == (MAX_CPU_HOSTS, 4)


def test_auto_on_gpus_runs_one_host_per_gpu() -> None:
    assert resolve_layout("auto", "auto", gpus=1, cores=16).replicas == 1
    layout = resolve_layout("auto", "auto", gpus=4, cores=16)
    assert (layout.replicas, layout.torch_threads) == (4, 4)


def test_explicit_values_win_over_auto() -> None:
    layout = resolve_layout(3, 2, gpus=0, cores=2)
    assert (layout.replicas, layout.torch_threads, layout.reason) == (3, 2, "as set")


def test_one_explicit_value_has_the_other_chosen_around_it() -> None:
    assert resolve_layout(1, "auto", gpus=0, cores=8).torch_threads == 8, "one host gets every core"
    assert resolve_layout("auto", 2, gpus=0, cores=8).replicas == 4, "hosts of two threads fill eight cores"
    assert resolve_layout("auto", 0, gpus=0, cores=8).replicas == 1, "torch's default threads take every core"


def test_the_device_setting_says_how_many_gpus_the_hosts_get() -> None:
    assert gpu_devices("cpu", ["0"]) == 0
    assert gpu_devices("auto", []) == 0
    assert gpu_devices("auto", ["0", "1"]) == 1, "a worker left to auto takes one GPU (the launcher pins one each)"
    assert gpu_devices("cuda:0,cuda:1", []) == 2


def test_a_cgroup_quota_limits_the_usable_cores(tmp_path: Path) -> None:
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("100000 100000\n", encoding="ascii")
    assert usable_cores(cpu_max) == 1
    cpu_max.write_text("max 100000\n", encoding="ascii")
    assert usable_cores(cpu_max) == usable_cores(tmp_path / "missing") >= 1


def test_the_settings_read_auto_or_a_number_and_refuse_anything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TTS_MODEL_REPLICAS", raising=False)
    monkeypatch.delenv("TTS_TORCH_THREADS", raising=False)
    assert (load_settings().model_replicas, load_settings().torch_threads) == ("auto", "auto")
    monkeypatch.setenv("TTS_MODEL_REPLICAS", "3")
    monkeypatch.setenv("TTS_TORCH_THREADS", "0")
    assert (load_settings().model_replicas, load_settings().torch_threads) == (3, 0)
    monkeypatch.setenv("TTS_MODEL_REPLICAS", "0")
    with pytest.raises(SettingsInvalid, match="TTS_MODEL_REPLICAS"):
        load_settings()
    monkeypatch.setenv("TTS_MODEL_REPLICAS", "many")
    with pytest.raises(SettingsInvalid, match="TTS_MODEL_REPLICAS"):
        load_settings()


def test_auto_on_cpus_lets_a_call_running_alone_take_the_idle_hosts_cores() -> None:
    assert resolve_layout("auto", "auto", gpus=0, cores=4).shared_cores == 4
    assert resolve_layout("auto", "auto", gpus=0, cores=1).shared_cores == 0, "one host has nothing to share"
    assert resolve_layout(2, 1, gpus=0, cores=2).shared_cores == 0, "a layout set by hand is kept as set"
    assert resolve_layout("auto", "auto", gpus=1, cores=16).shared_cores == 0
