"""Deployment files agree with the code: they parse, name real metrics and real settings."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY
from pydantic import AliasChoices

import core.metrics  # noqa: F401  (registers the exported metrics)
from core.settings import Settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
ENV_NAME = re.compile(r"\b(?:TTS_[A-Z0-9_]+|REDIS_URL)\b")
#: The series names Prometheus sees for each metric type (counters gain _total).
SERIES_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}


def _walk(node: Any) -> Iterator[tuple[Any, Any]]:
    """Yield every (key, value) pair of every mapping inside a parsed document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))


def _k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    return docs


def _exported_series_names() -> set[str]:
    """Return every series name the code's metrics produce, e.g. tts_batch_size_bucket."""
    return {family.name + suffix for family in REGISTRY.collect() for suffix in SERIES_SUFFIXES.get(family.type, ("",))}


def _settings_env_names() -> set[str]:
    prefix = Settings.model_config.get("env_prefix", "")
    names = set()
    for field_name, field in Settings.model_fields.items():
        if isinstance(field.validation_alias, AliasChoices):
            names.update(str(choice) for choice in field.validation_alias.choices)
        else:
            names.add(f"{prefix}{field_name}".upper())
    return names


def _deploy_env_names() -> dict[str, str]:
    """Map every TTS_* / REDIS_URL variable the deploy files set to where it is set."""
    found: dict[str, str] = {}
    for service, spec in _compose()["services"].items():
        env = spec.get("environment") or {}
        keys = env if isinstance(env, dict) else [item.split("=", 1)[0] for item in env]
        found.update({key: f"compose.yaml:{service}" for key in keys})
    for doc in _k8s_docs():
        where = f"k8s {doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in ("ConfigMap", "Secret"):
            found.update({key: where for key in {**doc.get("data", {}), **doc.get("stringData", {})}})
        for key, value in _walk(doc):
            if key == "env":
                found.update({item["name"]: where for item in value})
    for path in [*sorted((DEPLOY / "systemd").iterdir()), DEPLOY / "Dockerfile"]:
        found.update({name: path.name for name in ENV_NAME.findall(path.read_text(encoding="utf-8"))})
    return {name: where for name, where in found.items() if ENV_NAME.fullmatch(name)}


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_under_deploy_parses(path: Path) -> None:
    docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    assert any(docs), f"{path} is empty"


def test_every_metric_the_dashboard_queries_is_exported_by_the_code() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "tts.json").read_text(encoding="utf-8"))
    exprs = [value for key, value in _walk(dashboard) if key == "expr"]
    assert exprs, "the dashboard has no queries"
    queried = {name for expr in exprs for name in re.findall(r"\btts_[a-z0-9_]+", expr)}
    missing = sorted(queried - _exported_series_names())
    assert not missing, f"the dashboard queries metrics core/metrics.py does not export: {missing}"


def test_every_tts_variable_in_the_deploy_files_is_a_settings_field() -> None:
    known = _settings_env_names()
    unknown = {name: where for name, where in sorted(_deploy_env_names().items()) if name not in known}
    assert not unknown, f"variables with no field in core.settings.Settings: {unknown}"


def test_compose_keeps_the_broker_from_evicting_and_lets_the_cache_evict() -> None:
    services = _compose()["services"]
    broker = " ".join(services["redis"]["command"])
    cache = " ".join(services["redis-cache"]["command"])
    assert "--maxmemory-policy noeviction" in broker
    assert "--appendonly yes" in broker
    assert "--appendfsync everysec" in broker
    assert "--maxmemory-policy allkeys-lru" in cache


def test_the_compose_worker_reserves_its_gpu() -> None:
    worker = _compose()["services"]["worker-gpu0"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}]
    assert worker["environment"]["TTS_DEVICE"] == "cuda:0"


def test_the_k8s_worker_holds_one_gpu_and_outlasts_a_task() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _k8s_docs()}
    pod = docs[("Deployment", "tts-worker")]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    limit = int(docs[("ConfigMap", "tts-config")]["data"].get("TTS_TASK_TIME_LIMIT_S", 300))
    assert pod["terminationGracePeriodSeconds"] > limit
    triggers = docs[("ScaledObject", "tts-worker")]["spec"]["triggers"]
    assert {t["metadata"]["listName"] for t in triggers if t["type"] == "redis"} == {"realtime", "batch"}
    late = [t["metadata"]["query"] for t in triggers if t["type"] == "prometheus"]
    assert late == ['sum(tts_segments_outstanding{state="due"})'], "workers prefetch: late work is the signal"
