"""Shared fixtures: a real Redis, a real worker, the API app, the tiny ChatTTS."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from api import create_app
from client.api import TTSClient
from core.audio import to_pcm16
from tests.support.http import serving
from tests.support.servers import ROOT, ApiProcess, RedisServer, WorkerProcess, free_port
from workers.engines.base import SynthesisRequest
from workers.engines.espeak import EspeakEngine

IN_CI = os.environ.get("CI") == "true"

# The test-only engines (tests/support/engines.py: `faulty`) are a plugin, never in the production registry. Set
# here, before any registry loads, so that every registry this suite loads knows them: in this process and in
# the processes it starts, which inherit its environment.
os.environ["TTS_ENGINE_PLUGINS"] = "tests.support.engines"


@pytest.fixture(scope="session")
def speech() -> tuple[bytes, int]:
    """Return a few seconds of real speech (eSpeak NG) as 16-bit PCM and its rate."""
    engine = EspeakEngine(language="en-us", voices={"default": ""})
    engine.load()
    text = "The job store keeps every finished segment compactly, and only for as long as it was told to."
    [wave] = engine.synthesize([SynthesisRequest(text=text, voice="default")])
    return to_pcm16(wave), engine.sample_rate


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[redis.Redis]:
    """Return a client of a Redis of this test's own, whose maxmemory and store-wide keys the test may set."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield redis.Redis.from_url(server.url)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """Start a real redis-server for the whole session; skip locally, fail in CI, if none is installed."""
    try:
        server = RedisServer(tmp_path_factory.mktemp("redis"))
    except RuntimeError as e:
        if IN_CI:
            raise
        pytest.skip(str(e))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Run torch on one thread: the tiny model's ops are too small to share, and 2 threads stall on a busy CPU."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the tiny random-weight ChatTTS once per session."""
    from workers.engines.chattts_tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("chattts-tiny"))


@pytest.fixture(scope="session")
def models_file(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """Return the project's registry plus a model whose weights are broken, and a listening test's own espeak-en.

    The broken model's files are whole (so it is available, and accepted at submission) but its descriptor states
    the wrong sizes: the model fails as it loads, in the worker, as weights of the wrong model do.
    """
    from workers.engines.chattts_assets import DESCRIPTOR_NAME

    registry = json.loads((ROOT / "models.json").read_text(encoding="utf-8"))
    broken_dir = tmp_path_factory.mktemp("broken-weights")
    shutil.copytree(tiny_model_dir, broken_dir, dirs_exist_ok=True)
    descriptor = json.loads((broken_dir / DESCRIPTOR_NAME).read_text(encoding="utf-8"))
    descriptor["sizes"]["embed"]["hidden_size"] *= 2
    (broken_dir / DESCRIPTOR_NAME).write_text(json.dumps(descriptor), encoding="utf-8")
    registry["models"]["broken-chattts"] = {
        **registry["models"]["chattts-tiny"],
        "weights": str(broken_dir),
    }
    # eSpeak NG keeps its pitch-flutter phase in a C static across utterances, so a host's audio depends on what it
    # spoke before; the listening test (test_speech_check) gets a host of its own, with no history but its job's.
    registry["models"]["espeak-en-heard"] = dict(registry["models"]["espeak-en"])
    path = broken_dir.parent / "test-models.json"
    path.write_text(json.dumps(registry), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def settings_env(redis_server: RedisServer, tiny_model_dir: Path, models_file: Path) -> dict[str, str]:
    """Return the environment shared by the API under test and its workers."""
    return {
        "REDIS_URL": redis_server.url,
        "TTS_TINY_MODEL_DIR": str(tiny_model_dir),
        "TTS_MODELS_FILE": str(models_file),
        "TTS_DEFAULT_MODEL": "espeak-en",
        "TTS_HEARTBEAT_S": "0.5",
        "TTS_SEGMENT_MAX_ATTEMPTS": "2",
        "TTS_DEVICE": "cpu",
        # One model host of one torch thread per model: the suite shares 2 cores with Redis, the API and the
        # tests, and its tests of a model host (kills, loads, evictions) each mean the one host. `auto` (what
        # `make run` gets) is tested in test_layout and run by the chaos scenarios and the benchmarks.
        "TTS_TORCH_THREADS": "1",
        "TTS_MODEL_REPLICAS": "1",
        "TTS_LOG_LEVEL": "INFO",
        "TTS_LOG_FORMAT": "json",
        "TTS_METRICS_PORT": str(free_port()),
    }


@pytest.fixture(scope="session")
def worker(
    settings_env: dict[str, str], redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """Run one real worker process for the session."""
    process = WorkerProcess(settings_env, tmp_path_factory.mktemp("logs") / "worker.log")
    process.start()
    try:
        process.wait_ready(redis.Redis.from_url(redis_server.url))
        yield process
    finally:
        process.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """Return a client of the test Redis, with every job removed before and after."""
    client = redis.Redis.from_url(redis_server.url)
    _drop_jobs(client)
    yield client
    _drop_jobs(client)


def _drop_jobs(client: redis.Redis) -> None:
    # Only our job, deadline-book, breaker and stats keys: the broker's bindings and the workers' heartbeats stay.
    for pattern in ("tts:job:*", "tts:sched:*", "tts:stats:*", "tts:breaker", "tts:outbox", "tts:*:kept"):
        for key in client.scan_iter(match=pattern, count=500):
            client.delete(key)


def _app_config(settings_env: dict[str, str]) -> dict[str, Any]:
    mapping = {
        "REDIS_URL": "redis_url",
        "TTS_TINY_MODEL_DIR": "tiny_model_dir",
        "TTS_MODELS_FILE": "models_file",
        "TTS_DEFAULT_MODEL": "default_model",
        "TTS_HEARTBEAT_S": "heartbeat_s",
    }
    return {field: settings_env[env] for env, field in mapping.items()}


@pytest.fixture
def app(settings_env: dict[str, str], redis_client: redis.Redis) -> Iterator[Flask]:
    """Return the API app wired to the test Redis; its connections are closed after the test."""
    built = create_app(_app_config(settings_env))
    yield built
    built.extensions["tts"].close()


@pytest.fixture
def client(app: Flask, worker: WorkerProcess) -> FlaskClient:
    """Return a test client of the API; a worker is alive (admission needs one) but tests may bypass it."""
    return app.test_client()


@pytest.fixture
def served(app: Flask, worker: WorkerProcess) -> FlaskClient:
    """Return a test client of an API whose jobs a real worker serves."""
    return app.test_client()


#: The real server's stream limits and keep-alive, small so that tests reach them quickly.
GUNICORN_STREAMS_PER_CALLER = 20
GUNICORN_KEEPALIVE_S = 1.0


@pytest.fixture
def base_url(app: Flask, worker: WorkerProcess) -> Iterator[str]:
    """Serve the API over real HTTP, with a real worker behind it."""
    with serving(app) as url:
        yield url


@pytest.fixture
def tts(base_url: str) -> Iterator[TTSClient]:
    """Return a client of the served API."""
    with TTSClient(base_url) as client:
        yield client


@pytest.fixture(scope="session")
def gunicorn_api(settings_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiProcess]:
    """Serve the API with `make run`'s gunicorn command (two gevent processes, shared metrics folder)."""
    env = {
        **settings_env,
        "TTS_MAX_STREAMS_PER_CALLER": str(GUNICORN_STREAMS_PER_CALLER),
        "TTS_STREAM_KEEPALIVE_S": str(GUNICORN_KEEPALIVE_S),
    }
    workdir = tmp_path_factory.mktemp("gunicorn")
    server = ApiProcess(env, workdir / "gunicorn.log", metrics_dir=workdir / "prometheus")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the session worker's last log lines to the report of a failed test that used it."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    worker = getattr(item, "funcargs", {}).get("worker")
    if report.failed and isinstance(worker, WorkerProcess):
        alive = worker.process is not None and worker.process.poll() is None
        report.sections.append((f"session worker log (alive: {alive}), last lines", worker.log_tail(40)))
