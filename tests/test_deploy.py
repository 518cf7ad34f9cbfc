"""Deployment files agree with the code: they parse, name real metrics and real settings."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY
from pydantic import AliasChoices

import core.metrics  # noqa: F401  (registers the exported metrics)
from celery_config import QUEUES
from core.apikeys import KeyConfigError, parse_api_keys
from core.settings import Settings
from workers.launch import ALLOCATOR_ENV

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
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


def _k8s() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in _k8s_docs()}


def _unit(name: str) -> dict[str, list[str]]:
    """Map each setting of a systemd unit to its values, in order (continuation lines joined)."""
    settings: dict[str, list[str]] = {}
    text = (DEPLOY / "systemd" / name).read_text(encoding="utf-8").replace("\\\n", " ")
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def _unit_env(name: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in _unit(name).get("Environment", []))


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


def test_the_k8s_worker_holds_one_gpu_and_outlasts_a_hung_engine_call() -> None:
    docs = _k8s()
    pod = docs[("Deployment", "tts-worker")]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    limit = int(docs[("ConfigMap", "tts-config")]["data"].get("TTS_TASK_TIME_LIMIT_S", 300))
    assert pod["terminationGracePeriodSeconds"] == 330 > limit


def test_every_worker_deployment_drains_for_the_same_time() -> None:
    grace = _k8s()[("Deployment", "tts-worker")]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert _compose()["services"]["worker-gpu0"]["stop_grace_period"] == f"{grace}s"
    assert _unit("tts-worker@.service")["TimeoutStopSec"] == [str(grace)]
    assert _unit("tts-worker@.service")["KillMode"] == ["mixed"], "model hosts keep serving the draining segments"


def test_keda_scales_on_the_api_metrics_taken_once_across_api_pods() -> None:
    docs = _k8s()
    triggers = docs[("ScaledObject", "tts-worker")]["spec"]["triggers"]
    assert {t["type"] for t in triggers} == {"prometheus"}, "a lane is one Redis list per priority step"
    queries = {t["metadata"]["query"]: t["metadata"]["threshold"] for t in triggers}
    # Every API pod exports the same shared-Redis count: sum() would multiply it by the API pods.
    assert queries == {
        'max(tts_segments_outstanding{state="due"})': "16",
        'max(tts_queue_depth{lane="realtime"})': "4",
        'max(tts_queue_depth{lane="batch"})': "64",
    }
    assert {lane for q in queries for lane in re.findall(r'lane="(\w+)"', q)} == set(QUEUES)
    queried = {name for q in queries for name in re.findall(r"\btts_[a-z0-9_]+", q)}
    assert queried <= _exported_series_names()
    for trigger in triggers:  # KEDA resolves a bare name in its own namespace
        assert re.fullmatch(r"http://[a-z0-9-]+\.[a-z0-9-]+\.svc:9090", trigger["metadata"]["serverAddress"])
    assert not [d for d in _k8s_docs() if d["kind"] == "TriggerAuthentication"], "nothing uses it"


def test_the_k8s_api_stays_ready_without_workers_and_has_time_to_start() -> None:
    docs = _k8s()
    api = docs[("Deployment", "tts-api")]["spec"]["template"]["spec"]["containers"][0]
    # /readyz is 503 with no live worker: as readiness it would empty the Service during a worker rollout.
    assert api["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    startup = api["startupProbe"]
    assert startup["httpGet"] == {"path": "/healthz", "port": "http"}
    assert startup["failureThreshold"] * startup["periodSeconds"] == 150


def test_workers_are_disrupted_one_at_a_time() -> None:
    docs = _k8s()
    budget = docs[("PodDisruptionBudget", "tts-worker")]["spec"]
    assert budget["maxUnavailable"] == 1
    labels = docs[("Deployment", "tts-worker")]["spec"]["template"]["metadata"]["labels"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()


def test_the_models_volume_can_be_filled_and_is_mounted_read_only() -> None:
    docs = _k8s()
    assert docs[("PersistentVolumeClaim", "tts-models")]["spec"]["accessModes"] == ["ReadWriteMany"]
    for name in ("tts-api", "tts-worker"):
        pod = docs[("Deployment", name)]["spec"]["template"]["spec"]
        claims = [v["persistentVolumeClaim"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert claims == [{"claimName": "tts-models", "readOnly": True}]


def test_the_example_api_keys_are_refused_if_applied_unchanged() -> None:
    example = _k8s()[("Secret", "tts-api-keys")]["stringData"]["TTS_API_KEYS"]
    with pytest.raises(KeyConfigError, match="placeholder"):
        parse_api_keys(example)


def test_the_api_may_open_a_file_per_held_connection() -> None:
    assert _unit("tts-api.service")["LimitNOFILE"] == ["65536"]
    assert _compose()["services"]["api"]["ulimits"] == {"nofile": {"soft": 65536, "hard": 65536}}


@pytest.mark.parametrize("unit", ["tts-api.service", "tts-worker@.service"])
def test_the_systemd_units_hold_glibc_malloc_as_the_image_does(unit: str) -> None:
    env = _unit_env(unit)
    assert {key: env.get(key) for key in ALLOCATOR_ENV} == ALLOCATOR_ENV
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert all(f"{key}={value}" in dockerfile for key, value in ALLOCATOR_ENV.items())


def test_gunicorn_raises_its_soft_open_files_limit_up_to_the_hard_one() -> None:
    # A child process: the test lowers its soft limit, which only root could raise past the hard one.
    script = """
import resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
sys.path.insert(0, "api")
import gunicorn_conf
warnings = []
class Log:
    def warning(self, *args): warnings.append(args)
class Server:
    log = Log()
gunicorn_conf.on_starting(Server())
new_soft, new_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
print(new_soft, new_hard, hard, gunicorn_conf.worker_connections, gunicorn_conf.OPEN_FILES_WANTED, len(warnings))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    soft, hard, hard_before, connections, wanted, warnings = (int(v) for v in out.stdout.split())
    assert hard == hard_before, "the hard limit is never touched"
    assert soft == min(wanted, hard) > 256
    assert warnings == (1 if soft < connections else 0)


def test_the_image_leaves_out_secrets_and_local_artifacts() -> None:
    ignored = set((DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines())
    assert {"**/.env*", "bench/results", ".hypothesis", ".gpu", ".whl", "**/*.whl"} <= ignored
