"""Deployment files agree with the code: they parse, name real metrics and real settings."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client import REGISTRY
from pydantic import AliasChoices

import core.metrics  # noqa: F401  (registers the exported metrics)
from cache.workers import WorkerRegistry
from celery_config import QUEUES
from core.apikeys import KeyConfigError, parse_api_keys
from core.settings import Settings
from core.store_url import parse_sentinel_url
from tests.support.databases import spare_database
from tests.support.processes import wait_for
from tests.support.servers import RedisServer, free_port
from workers import probe
from workers.launch import ALLOCATOR_ENV

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
ENV_NAME = re.compile(r"\b(?:TTS_[A-Z0-9_]+|REDIS_URL)\b")
#: A database of the suite's Redis where no running worker announces itself: the probes see only the tests' beats.
PROBE_DB = 14
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


def _compose(name: str = "compose.yaml") -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / name).read_text(encoding="utf-8"))


def _sentinel_compose() -> dict[str, dict[str, Any]]:
    """Return the services of compose.yaml with compose.sentinel.yaml over it, merged as compose merges them."""
    services: dict[str, dict[str, Any]] = _compose()["services"]
    for name, override in _compose("compose.sentinel.yaml")["services"].items():
        merged = dict(services.get(name, {}))
        for key, value in override.items():
            both_maps = isinstance(value, dict) and isinstance(merged.get(key), dict)
            merged[key] = {**merged[key], **value} if both_maps else value
        services[name] = merged
    return services


def _interpolate(text: str, **env: str) -> str:
    """Return ``text`` as compose passes it on: ``${VAR...}`` from ``env`` (or its default), ``$$`` as ``$``."""

    def value(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(3) or ""
        return env.get(name, default if match.group(2) == ":-" else "")

    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", value, text.replace("$$", "\0")).replace("\0", "$")


def _directives(conf: str) -> dict[str, str]:
    """Map each directive of a Redis or Sentinel config (all its words but the last) to its last word."""
    lines = [line.split() for line in conf.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return {" ".join(words[:-1]): words[-1] for words in lines}


def _conf_lines(script: str) -> dict[str, str]:
    """Return the directives of the config a start script writes (its here-document)."""
    body = re.search(r"<<EOF\n(.*?)\n\s*EOF$", script, re.DOTALL | re.MULTILINE)
    assert body, "the script writes no config"
    return _directives(body.group(1))


def _compose_script(service: dict[str, Any]) -> str:
    command = service["command"]
    assert command[:2] == ["sh", "-c"], command
    return _interpolate(command[2], REDIS_PASSWORD="pw")


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
    for name in ("compose.yaml", "compose.sentinel.yaml"):
        for service, spec in _compose(name)["services"].items():
            env = spec.get("environment") or {}
            keys = env if isinstance(env, dict) else [item.split("=", 1)[0] for item in env]
            found.update({key: f"{name}:{service}" for key in keys})
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


def test_every_command_of_the_image_runs_under_tini_as_pid_1() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.MULTILINE)
    assert entrypoint is not None
    # No -g: SIGTERM goes to the command alone; the worker's model hosts keep serving its drain.
    assert json.loads(entrypoint.group(1)) == ["/usr/bin/tini", "--", "/usr/local/bin/tts-entrypoint"]
    assert re.search(r"apt-get install [^\n]*\btini\b", dockerfile)
    assert "COPY --chmod=0755 deploy/entrypoint.sh /usr/local/bin/tts-entrypoint" in dockerfile
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    assert ignored.index("!deploy/entrypoint.sh") > ignored.index("deploy"), "the build context must hold it"
    # Kubernetes' `command` would replace the ENTRYPOINT; compose's `command` replaces only CMD.
    for doc in _k8s_docs():
        if doc["kind"] == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                assert "command" not in container and container["args"], doc["metadata"]["name"]
    for name, service in _compose()["services"].items():
        if str(service.get("image", "")).startswith("tts-queue:"):
            assert "entrypoint" not in service, name
            assert "init" not in service, f"{name}: Docker's init would nest a second one over the image's tini"


def test_the_entrypoint_clears_stale_metric_files_then_becomes_the_command(tmp_path: Path) -> None:
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    for stale in ("counter_7.db", "gauge_livesum_8.db", "histogram_7.db"):  # a dead container's processes
        (metrics_dir / stale).write_bytes(b"\0" * 16)
    (metrics_dir / "notes.txt").write_text("not a metric file", encoding="utf-8")
    command = ["sh", str(DEPLOY / "entrypoint.sh"), "sh", "-c", 'echo $$; ls "$PROMETHEUS_MULTIPROC_DIR"']
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as child:
        out, _ = child.communicate(timeout=30)
    pid, *left = out.split()
    assert child.returncode == 0
    assert int(pid) == child.pid, "exec'd: the command is tini's child itself, so tini's SIGTERM reaches it"
    assert left == ["notes.txt"]
    unset = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    assert subprocess.run(["sh", str(DEPLOY / "entrypoint.sh"), "true"], env=unset, check=False).returncode == 0


def test_the_k8s_api_merges_its_metrics_in_the_emptydir_and_the_worker_in_none() -> None:
    docs = _k8s()
    api_pod = docs[("Deployment", "tts-api")]["spec"]["template"]["spec"]
    api = api_pod["containers"][0]
    folder = next(item["value"] for item in api["env"] if item["name"] == "PROMETHEUS_MULTIPROC_DIR")
    mounted = {m["mountPath"]: m["name"] for m in api["volumeMounts"]}
    volume = next(v for v in api_pod["volumes"] if v["name"] == mounted[folder])
    assert volume["emptyDir"]["medium"] == "Memory", "outlives a container restart: the entrypoint clears it"
    worker = docs[("Deployment", "tts-worker")]["spec"]["template"]["spec"]["containers"][0]
    assert "PROMETHEUS_MULTIPROC_DIR" not in {item["name"] for item in worker["env"]}


def test_the_k8s_worker_probes_read_its_heartbeat_and_wait_out_loading_and_draining() -> None:
    docs = _k8s()
    pod = docs[("Deployment", "tts-worker")]["spec"]["template"]["spec"]
    worker = pod["containers"][0]
    startup, liveness = worker["startupProbe"], worker["livenessProbe"]
    assert startup["exec"]["command"] == ["python", "-m", "workers.probe", "started"]
    assert liveness["exec"]["command"] == ["python", "-m", "workers.probe", "live"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 600, "model loads take minutes on a cold node"
    assert (liveness["periodSeconds"], liveness["failureThreshold"], liveness["timeoutSeconds"]) == (20, 3, 10)
    # The timings assume the default heartbeat: a beat every 2 s, dead after 3 missed (6 s).
    config = docs[("ConfigMap", "tts-config")]["data"]
    assert not {"TTS_HEARTBEAT_S", "TTS_HEARTBEAT_MISSES"} & (set(config) | {item["name"] for item in worker["env"]})
    fields = Settings.model_fields
    dead_after = fields["heartbeat_s"].default * fields["heartbeat_misses"].default
    assert liveness["periodSeconds"] > dead_after, "each failure is a separate stretch of missed beats"
    assert liveness["timeoutSeconds"] > 2 * 3, "the probe's own Redis timeouts (connect, read) fit inside it"
    # Its segments were handed on once it missed its beats: no 330 s drain for a wedged worker.
    assert liveness["terminationGracePeriodSeconds"] == 30 < pod["terminationGracePeriodSeconds"]
    assert "readinessProbe" not in worker, "no Service sends a worker traffic"


@pytest.fixture
def probe_db(redis_server: RedisServer) -> Iterator[str]:
    with spare_database(redis_server.url, PROBE_DB) as url:
        yield url


def _run_probe(url: str, which: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REDIS_URL": url}
    return subprocess.run([sys.executable, "-m", "workers.probe", which], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_the_worker_probe_passes_once_this_containers_worker_beats_with_its_models_loaded(probe_db: str) -> None:
    workers = WorkerRegistry(redis.Redis.from_url(probe_db), ttl_s=6)
    me = f"tts-cpu-{os.getpid()}@{socket.gethostname()}"  # named as workers/__main__.py names a worker
    assert _run_probe(probe_db, "started").returncode == 1
    assert _run_probe(probe_db, "live").returncode == 1, "Redis answers, and no beat"
    workers.beat(me, {"pid": os.getpid(), "loading": ["chattts"]})
    loading = _run_probe(probe_db, "started")
    assert (loading.returncode, loading.stdout.strip()) == (1, "still loading chattts")
    assert _run_probe(probe_db, "live").returncode == 0
    workers.beat(me, {"pid": os.getpid(), "loading": []})
    assert _run_probe(probe_db, "started").returncode == 0


def test_the_worker_probe_counts_only_fresh_beats_of_this_host_newer_than_their_process(
    probe_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    workers = WorkerRegistry(redis.Redis.from_url(probe_db), ttl_s=1)
    workers.beat(f"tts-0-{os.getpid()}@another-pod", {"pid": os.getpid(), "loading": []})
    assert probe.started(workers, host="this-pod")[0] is False
    assert probe.live(workers, host="this-pod")[0] is False
    workers.beat(f"tts-0-{os.getpid()}@this-pod", {"pid": os.getpid(), "loading": []})
    assert probe.started(workers, host="this-pod")[0] is True
    assert probe.live(workers, host="this-pod")[0] is True
    with monkeypatch.context() as patched:  # the beat is a dead container's: its pid now runs a newer process
        patched.setattr(probe, "started_at", lambda pid: time.time() + 60)
        assert probe.started(workers, host="this-pod")[0] is False
        assert probe.live(workers, host="this-pod")[0] is False
    # Past the 1 s after which the other workers would count it dead:
    wait_for(lambda: not probe.live(workers, host="this-pod")[0], 5, "the beat to age past 1 s")
    assert probe.live(workers, host="this-pod") == (
        False,
        "no heartbeat for over 1 s while Redis answers: the worker counts as dead",
    )


def test_the_liveness_probe_fails_a_worker_that_beats_while_its_upkeep_is_stuck(probe_db: str) -> None:
    workers = WorkerRegistry(redis.Redis.from_url(probe_db), ttl_s=6)
    me = f"tts-0-{os.getpid()}@this-pod"
    workers.beat(me, {"pid": os.getpid(), "loading": [], "upkeep_at": time.time() - 5})
    assert probe.live(workers, host="this-pod") == (True, "alive: beating, upkeep running")
    workers.beat(me, {"pid": os.getpid(), "loading": [], "upkeep_at": time.time() - probe.UPKEEP_STUCK_S - 30})
    alive, why = probe.live(workers, host="this-pod")
    assert not alive and "last upkeep pass ended 210 s ago" in why, why
    assert probe.started(workers, host="this-pod")[0] is True, "started says nothing of the upkeep"


def test_the_liveness_probe_passes_at_once_while_redis_cannot_be_reached() -> None:
    workers = WorkerRegistry(probe.redis_client(f"redis://127.0.0.1:{free_port()}/0"), ttl_s=6)
    begun = time.monotonic()
    assert probe.live(workers, host="this-pod")[0] is True, "a Redis outage must not restart every worker"
    assert probe.started(workers, host="this-pod")[0] is False
    assert time.monotonic() - begun < 5, "one try each, well inside the probes' timeoutSeconds (10 s)"


def test_the_probe_reads_when_a_process_started() -> None:
    before = time.time()
    with subprocess.Popen(["sleep", "30"]) as child:
        after = time.time()
        begun = probe.started_at(child.pid)
        child.kill()
    assert begun is not None
    assert before - 1.5 <= begun <= after + 0.5  # /proc/stat's boot time is in whole seconds
    mine = probe.started_at(os.getpid())
    assert mine is not None and mine <= begun
    assert probe.started_at(child.pid) is None, "reaped: no such process"


# The job store as a Sentinel group: deploy/compose.sentinel.yaml, deploy/k8s/redis-sentinel.yaml, systemd.
#: What every data node of a Sentinel group runs with: any of them may become the primary.
DATA_NODE_SETTINGS = {
    "min-replicas-to-write": "1",
    "min-replicas-max-lag": "5",
    "maxmemory-policy": "noeviction",
    "appendonly": "yes",
    "appendfsync": "everysec",
}
#: What every Sentinel runs with (after `sentinel monitor <group> <primary> 6379` comes the quorum).
SENTINEL_SETTINGS = {
    "sentinel resolve-hostnames": "yes",
    "sentinel announce-hostnames": "yes",
    "sentinel down-after-milliseconds tts": "5000",
    "sentinel failover-timeout tts": "30000",
    "sentinel parallel-syncs tts": "1",
}
SENTINEL_SERVICES = ("sentinel-1", "sentinel-2", "sentinel-3")


def _k8s_scripts() -> dict[str, str]:
    return dict(_k8s()[("ConfigMap", "redis-scripts")]["data"])


def _compose_data_nodes() -> dict[str, dict[str, Any]]:
    return {name: spec for name, spec in _sentinel_compose().items() if "redis-server" in str(spec.get("command"))}


def test_the_sentinel_override_runs_a_primary_two_replicas_and_three_sentinels() -> None:
    services = _sentinel_compose()
    assert sorted(_compose_data_nodes()) == ["redis", "redis-2", "redis-3", "redis-cache"]
    sentinels = sorted(name for name, spec in services.items() if "redis-sentinel" in str(spec.get("command")))
    assert sentinels == list(SENTINEL_SERVICES)
    members = ("redis", "redis-2", "redis-3", *SENTINEL_SERVICES)
    for name in members:
        assert services[name]["hostname"] == name, "members announce the name the others resolve"
        assert services[name]["image"] == services["redis-cache"]["image"]
    volumes = {services[name]["volumes"][0].split(":")[0] for name in members}
    assert len(volumes) == len(members), "every member keeps its own data or Sentinel file"


def test_every_data_node_of_the_sentinel_group_refuses_writes_without_a_replica_and_never_evicts() -> None:
    nodes = {name: spec for name, spec in _compose_data_nodes().items() if name != "redis-cache"}
    for name, spec in nodes.items():
        conf = _conf_lines(_compose_script(spec))
        assert {key: conf.get(key) for key in DATA_NODE_SETTINGS} == DATA_NODE_SETTINGS, name
        assert conf["replica-announce-ip"] == "$me" and conf["masterauth"] == '"$REDISCLI_AUTH"', name
    k8s = _conf_lines(_k8s_scripts()["redis.sh"])
    assert {key: k8s.get(key) for key in DATA_NODE_SETTINGS} == DATA_NODE_SETTINGS
    assert k8s["replica-announce-ip"] == "$ME" and k8s["masterauth"] == '"$REDISCLI_AUTH"'
    systemd = (DEPLOY / "systemd" / "redis-tts.conf").read_text(encoding="utf-8")
    for key in ("min-replicas-to-write 1", "min-replicas-max-lag 5", "masterauth"):
        assert f"\n# {key}" in systemd, key
    # The sentence cache may evict: losing it loses only cached audio.
    cache = _sentinel_compose()["redis-cache"]
    assert cache == _compose()["services"]["redis-cache"] and "allkeys-lru" in str(cache["command"])


def test_every_sentinel_watches_the_group_with_the_same_quorum_and_timings() -> None:
    scripts = [_compose_script(_sentinel_compose()[name]) for name in SENTINEL_SERVICES]
    scripts.append(_k8s_scripts()["sentinel.sh"].replace("$SERVICE", "tts"))
    systemd = _directives((DEPLOY / "systemd" / "sentinel-tts.conf").read_text(encoding="utf-8"))
    for conf in [*map(_conf_lines, scripts), systemd]:
        assert {key: conf.get(key) for key in SENTINEL_SETTINGS} == SENTINEL_SETTINGS
        monitor = next(key for key in conf if key.startswith("sentinel monitor tts "))
        assert monitor.split()[-1] == "6379" and conf[monitor] == "2", "quorum 2 of 3"


def test_the_api_worker_and_flower_of_the_sentinel_override_find_the_primary_through_the_sentinels() -> None:
    services = _sentinel_compose()
    for name in ("api", "worker-gpu0"):
        url = _interpolate(services[name]["environment"]["REDIS_URL"], REDIS_PASSWORD="pw")
        assert url.startswith("redis+sentinel://"), name
        group = parse_sentinel_url(url)
        assert group.sentinels == tuple((host, 26379) for host in SENTINEL_SERVICES)
        assert (group.service, group.db, group.password, group.sentinel_password) == ("tts", 0, "pw", "pw")
        waits_for = {services[name]["depends_on"].get(sentinel, {}).get("condition") for sentinel in SENTINEL_SERVICES}
        assert waits_for == {"service_healthy"}, name
        cache_url = services[name]["environment"]["TTS_CACHE_REDIS_URL"]
        assert cache_url == _compose()["services"][name]["environment"]["TTS_CACHE_REDIS_URL"], "one cache Redis"
    # Flower runs Celery's own CLI: kombu's Sentinel transport, the group named in its transport options.
    flower = services["flower"]
    broker = _interpolate(flower["environment"]["CELERY_BROKER_URL"], REDIS_PASSWORD="pw")
    assert broker.split(";") == [f"sentinel://:pw@{host}:26379/0" for host in SENTINEL_SERVICES]
    assert '"master_name": "tts"' in _compose_script(flower)


def test_the_k8s_sentinel_group_is_three_pods_one_per_node_disrupted_one_at_a_time() -> None:
    docs = _k8s()
    redis_set = docs[("StatefulSet", "redis")]["spec"]
    assert redis_set["replicas"] == 3, "common.sh names three pods"
    assert "for i in 0 1 2;" in _k8s_scripts()["common.sh"]
    pod = redis_set["template"]["spec"]
    labels = redis_set["template"]["metadata"]["labels"]
    (rule,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert (
        rule["topologyKey"] == "kubernetes.io/hostname"
        and rule["labelSelector"]["matchLabels"].items() <= labels.items()
    )
    budget = docs[("PodDisruptionBudget", "redis")]["spec"]
    assert budget["maxUnavailable"] == 1 and budget["selector"]["matchLabels"].items() <= labels.items()
    assert [claim["metadata"]["name"] for claim in redis_set["volumeClaimTemplates"]] == ["data"]
    headless = docs[("Service", redis_set["serviceName"])]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    assert "redis-headless" in _k8s_scripts()["common.sh"] and redis_set["serviceName"] == "redis-headless"
    sentinel_port = docs[("Service", "redis-sentinel")]["spec"]["ports"]
    assert [(p["port"], p["targetPort"]) for p in sentinel_port] == [(26379, "sentinel")]
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"redis", "sentinel"}
    for container in containers.values():
        assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
        secret = next(e for e in container["env"] if e["name"] == "REDISCLI_AUTH")["valueFrom"]["secretKeyRef"]
        assert secret["key"] in docs[("Secret", secret["name"])]["stringData"]
    assert containers["redis"]["lifecycle"]["preStop"]["exec"]["command"] == ["sh", "/scripts/prestop.sh"]
    assert pod["terminationGracePeriodSeconds"] > 30, "the preStop switchover waits up to 30 s"


def test_every_sentinel_url_the_k8s_files_show_names_the_sentinel_service_and_the_group() -> None:
    files = ("redis-sentinel.yaml", "redis-secret.example.yaml")
    texts = [(DEPLOY / "k8s" / name).read_text(encoding="utf-8") for name in files]
    urls = [url.rstrip('".,)').strip('"') for text in texts for url in re.findall(r"redis\+sentinel://\S+", text)]
    shown = [url for url in urls if "@" in url and "<release>" not in url]  # not the Bitnami chart's, nor "..."
    assert len(shown) >= 3
    for url in shown:
        group = parse_sentinel_url(url)
        assert (group.sentinels, group.service, group.db) == ((("redis-sentinel", 26379),), "tts", 0), url
        assert group.sentinel_password == group.password, "the Sentinels take the data nodes' password"
    assert "SERVICE=tts" in _k8s_scripts()["common.sh"]


@pytest.mark.parametrize("script", ["compose:redis", "compose:sentinel-1", "compose:flower", "redis.sh", "sentinel.sh",
                                    "prestop.sh", "common.sh"])  # fmt: skip
def test_every_redis_start_script_is_valid_sh(script: str) -> None:
    if script.startswith("compose:"):
        text = _compose_script(_sentinel_compose()[script.split(":", 1)[1]])
    else:
        text = _k8s_scripts()[script]
    checked = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr
