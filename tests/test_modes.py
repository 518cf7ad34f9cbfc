"""A mode selects a variant of a model: fast runs ChatTTS's transformer in int8 in a host of its own, loaded on
demand and evicted like any model; a mode the workers' devices cannot run is refused with those they can."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
import torch
from flask import Flask
from flask.testing import FlaskClient

from api import create_app
from cache.jobstore import JobStore
from cache.workers import WorkerRegistry
from core.errors import ValidationFailed
from core.registry import Registry, load_registry
from core.settings import load_settings
from tests.support.jobs import wait_done
from tests.support.processes import wait_for
from tests.support.servers import ROOT
from workers.engines.base import SynthesisRequest
from workers.engines.chattts import ChatTTSEngine
from workers.engines.chattts_int8 import int8_supported, quantized_bytes
from workers.engines.errors import EngineLoadError
from workers.engines.factory import device_for
from workers.pool.handle import ModelHost
from workers.pool.pool import ModelPool

SAID = "今天天气很好，我们一起去公园散步吧。"


def _registry(tmp_path: Path, tiny_model_dir: Path, **changes: Any) -> Registry:
    raw = json.loads((ROOT / "models.json").read_text(encoding="utf-8"))
    for name, fields in changes.items():
        raw["models"][name.replace("_", "-")].update(fields)
    path = tmp_path / "models.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return load_registry(load_settings(models_file=path, tiny_model_dir=tiny_model_dir))


def test_a_mode_is_a_model_of_its_own_named_model_at_mode(tmp_path: Path, tiny_model_dir: Path) -> None:
    registry = _registry(tmp_path, tiny_model_dir)
    balanced, fast, quality = (registry.get("chattts-tiny", m) for m in ("balanced", "fast", "quality"))
    assert balanced is registry.get("chattts-tiny") and balanced.name == "chattts-tiny"
    assert (fast.name, fast.precision, fast.devices, fast.fragment_ms) == (
        "chattts-tiny@fast",
        "int8",
        ("cpu",),
        "100,200",
    )
    assert (quality.name, quality.precision) == ("chattts-tiny@quality", "fp32")
    assert quality.options["fragment_lookahead"] == quality.options["fragment_first_lookahead"] == 16
    # Each has its own cache entries (its version) and answers to the name callers know.
    assert len({balanced.version, fast.version, quality.version}) == 3
    assert fast.model == quality.model == "chattts-tiny" and not fast.pinned
    assert registry.get("chattts-tiny@fast") == fast


def test_a_model_without_modes_serves_every_mode_itself(tmp_path: Path, tiny_model_dir: Path) -> None:
    registry = _registry(tmp_path, tiny_model_dir)
    espeak = registry.get("espeak-en")
    assert all(registry.get("espeak-en", mode) is espeak for mode in ("fast", "balanced", "quality"))


@pytest.mark.parametrize(
    ("modes", "complaint"),
    [
        ({"balanced": {"precision": "int8"}}, "balanced is the model"),
        ({"turbo": {}}, "a mode is one of"),
        ({"fast": {"weights": "/elsewhere"}}, "may set only"),
        ({"fast": {"precision": "int4"}}, "precision must be one of"),
        ({"fast": {"devices": ["tpu"]}}, "devices must be among"),
        ({"fast": {"fragment_ms": "fast"}}, "fragment_ms"),
    ],
)
def test_a_mode_that_changes_what_it_may_not_stops_the_registry_loading(
    tmp_path: Path, tiny_model_dir: Path, modes: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(ValueError, match=complaint):
        _registry(tmp_path, tiny_model_dir, chattts_tiny={"modes": modes})


def test_a_mode_no_worker_device_runs_names_the_modes_that_do(tmp_path: Path, tiny_model_dir: Path) -> None:
    registry = _registry(tmp_path, tiny_model_dir)
    with pytest.raises(ValidationFailed) as refused:
        registry.get("chattts-tiny", "fast", device_kinds=frozenset({"cuda"}))
    assert refused.value.status == 422
    assert "int8 on cpu only" in str(refused.value) and "['balanced', 'quality']" in str(refused.value)
    assert registry.get("chattts-tiny", "fast", device_kinds=frozenset({"cpu", "cuda"})).precision == "int8"


@pytest.fixture
def gpu_only_api(own_redis: redis.Redis, settings_env: dict[str, str]) -> Iterator[FlaskClient]:
    """Return an API whose only live worker runs its models on GPUs."""
    url = own_redis.connection_pool.connection_kwargs
    app: Flask = create_app(
        {
            "redis_url": f"redis://{url['host']}:{url['port']}/0",
            "tiny_model_dir": settings_env["TTS_TINY_MODEL_DIR"],
            "models_file": settings_env["TTS_MODELS_FILE"],
        }
    )
    WorkerRegistry(own_redis, ttl_s=60).beat("w-gpu", {"device_kinds": ["cuda"]})
    yield app.test_client()
    app.extensions["tts"].close()


def test_a_fast_request_to_gpu_workers_is_refused_with_the_modes_they_serve(gpu_only_api: FlaskClient) -> None:
    response = gpu_only_api.post("/v1/jobs", json={"text": SAID, "model": "chattts-tiny", "mode": "fast"})
    assert response.status_code == 422, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["field"] == "mode" and "use one of ['balanced', 'quality']" in error["message"]


def test_a_variant_named_by_the_caller_is_its_model_in_its_mode(gpu_only_api: FlaskClient) -> None:
    response = gpu_only_api.post("/v1/jobs", json={"text": SAID, "model": "chattts-tiny@quality"})
    assert response.status_code == 202, response.get_data(as_text=True)
    job = gpu_only_api.get(f"/v1/jobs/{response.get_json()['id']}").get_json()
    assert (job["model"], job["mode"]) == ("chattts-tiny", "quality")
    # Named, fast is still checked against the workers' devices.
    refused = gpu_only_api.post("/v1/jobs", json={"text": SAID, "model": "chattts-tiny@fast"})
    assert refused.status_code == 422 and refused.get_json()["error"]["field"] == "mode"


@pytest.mark.parametrize(
    ("body", "status", "field", "says"),
    [
        ({"model": "chattts-tiny@fast", "mode": "quality"}, 422, "mode", "names mode 'fast'"),
        ({"model": "chattts-tiny@turbo"}, 404, "model", "what follows '@' is a mode"),
    ],
)
def test_a_variant_name_that_contradicts_the_mode_or_names_no_mode_is_refused(
    gpu_only_api: FlaskClient, body: dict[str, str], status: int, field: str, says: str
) -> None:
    response = gpu_only_api.post("/v1/jobs", json={"text": SAID, **body})
    assert response.status_code == status, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["field"] == field and says in error["message"]


def test_a_gpu_worker_runs_a_cpu_only_variant_on_its_cpu(tmp_path: Path, tiny_model_dir: Path) -> None:
    registry = _registry(tmp_path, tiny_model_dir)
    fast, balanced = registry.get("chattts-tiny", "fast"), registry.get("chattts-tiny")
    assert device_for(fast, "cuda:1") == "cpu" and device_for(fast, "cpu") == "cpu"
    assert device_for(balanced, "cuda:1") == "cuda:1"


def test_the_model_list_says_what_each_mode_runs(served: FlaskClient) -> None:
    models = {m["id"]: m for m in served.get("/v1/models").get_json()["data"]}
    modes = models["chattts-tiny"]["modes"]
    assert modes["fast"] == {
        "model": "chattts-tiny@fast",
        "precision": "int8",
        "devices": ["cpu"],
        "fragment_ms": "100,200",
    }
    assert modes["balanced"]["model"] == "chattts-tiny" and modes["quality"]["precision"] == "fp32"
    assert {m["model"] for m in models["espeak-en"]["modes"].values()} == {"espeak-en"}


def test_a_fast_request_is_served_by_the_int8_variant_loaded_on_demand(
    served: FlaskClient, redis_client: redis.Redis
) -> None:
    response = served.post("/v1/jobs", json={"text": SAID, "model": "chattts-tiny", "mode": "fast", "cache": False})
    assert response.status_code == 202, response.get_data(as_text=True)
    job = wait_done(served, response.get_json()["id"], timeout=180)
    assert job["status"] == "done" and job["model"] == "chattts-tiny" and job["mode"] == "fast", job
    meta = JobStore(redis_client, ttl=600).segment_meta(job["id"])
    assert {m["model"] for m in meta.values()} == {"chattts-tiny@fast"}

    def fast_host() -> list[dict[str, Any]]:
        pools = [w.get("pool", []) for w in WorkerRegistry(redis_client, ttl_s=60).alive()]
        return [h for pool in pools for h in pool if h["model"] == "chattts-tiny@fast"]

    # The heartbeat lists it (its next beat, within TTS_HEARTBEAT_S) as a host of its own, in int8.
    wait_for(lambda: bool(fast_host()), timeout=10, what="the fast variant's host in a heartbeat")
    assert {h["precision"] for h in fast_host()} == {"int8"}


def test_a_mode_variant_is_evicted_under_the_memory_budget_like_any_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    registry = _registry(tmp_path, tiny_model_dir)
    fast, balanced = registry.get("chattts-tiny", "fast"), registry.get("chattts-tiny", "balanced")
    pool = ModelPool(lambda spec, _replica: ModelHost(spec, device="cpu", torch_threads=1), budget_mb=100_000,
                     idle_s=60, call_timeout_s=120)  # fmt: skip
    try:
        pool.synthesize(fast, [SynthesisRequest(text=SAID, mode="fast")])
        one_host = pool.used_mb()
        pool.budget_mb = one_host * 1.5  # room for one host, not two
        pool.synthesize(replace(balanced, memory_mb=int(one_host)), [SynthesisRequest(text=SAID)])
        assert [m["model"] for m in pool.loaded()] == ["chattts-tiny"]
        assert pool.counts["evictions"] == 1
    finally:
        pool.close()


def test_int8_runs_the_llamas_linear_layers_quantized_and_keeps_the_rest_in_fp32(tiny_model_dir: Path) -> None:
    int8 = ChatTTSEngine(weights_dir=tiny_model_dir, device="cpu", precision="int8", fixed_token_budget=True)
    fp32 = ChatTTSEngine(weights_dir=tiny_model_dir, device="cpu", precision="fp32", fixed_token_budget=True)
    int8.load()
    fp32.load()
    llama = int8.chat.gpt.gpt
    quantized = [m for m in llama.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    assert quantized and not any(isinstance(m, torch.nn.Linear) for m in llama.modules())
    # The heads that pick each token and the embeddings are untouched.
    embed = int8.chat.embed
    assert all(isinstance(head, torch.nn.Linear) for head in embed.head_code) and isinstance(
        embed.head_text, torch.nn.Linear
    )
    assert all(p.dtype == torch.float32 for p in embed.parameters())
    # Its weights take a byte each: about a quarter of what they took in fp32.
    linear = [m for m in fp32.chat.gpt.gpt.modules() if isinstance(m, torch.nn.Linear)]
    fp32_bytes = sum(p.numel() * p.element_size() for m in linear for p in m.parameters())
    assert len(linear) == len(quantized) and 0 < quantized_bytes(llama) < fp32_bytes / 3
    request = SynthesisRequest(text=SAID, seed=7)
    (wave,) = int8.synthesize([request])
    assert len(wave) > 0 and len(wave) == len(fp32.synthesize([request])[0])  # a fixed budget: the same length


def test_int8_is_refused_on_a_gpu_before_anything_loads(tiny_model_dir: Path) -> None:
    why = int8_supported("cuda:0")
    assert why is not None and "use mode balanced" in why
    assert int8_supported("cpu") is None
    engine = ChatTTSEngine(weights_dir=tiny_model_dir, device="cuda:0", precision="int8")
    with pytest.raises(EngineLoadError, match="int8 runs on the CPU only"):
        engine.load()
