"""Three workers (standing in for three GPUs) share one Redis: load spreads, and a killed one loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask

from api import create_app
from tests.support.processes import wait_for
from tests.support.servers import ROOT, RedisServer
from workers.launch import worker_environments


def test_each_launched_worker_is_pinned_to_its_own_device_and_metrics_port() -> None:
    envs = worker_environments(["0", "1", "2"], fake=False, base_port=9310)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "2"]
    assert {e["TTS_DEVICE"] for e in envs} == {"cuda:0"}
    assert [e["TTS_METRICS_PORT"] for e in envs] == ["9310", "9311", "9312"]
    assert worker_environments([], fake=False, base_port=9310)[0]["TTS_DEVICE"] in ("cpu", os.environ.get("TTS_DEVICE"))


@contextmanager
def launched(tmp_path: Path, env: dict[str, str], *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """Run `python -m workers.launch` with ``args`` on ``env``; stop it (SIGTERM, then SIGKILL) at the end."""
    with (tmp_path / "launch.log").open("ab") as log:
        launcher = subprocess.Popen([sys.executable, "-m", "workers.launch", *args],
                                    cwd=ROOT, env=env, stdout=log, stderr=log)  # fmt: skip
    try:
        yield launcher
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(60)
        except subprocess.TimeoutExpired:
            launcher.kill()


def tiny_app(redis_url: str, settings_env: dict[str, str]) -> Flask:
    """Return an API app on ``redis_url`` serving the tiny model by default."""
    return create_app(
        {
            "redis_url": redis_url,
            "models_file": settings_env["TTS_MODELS_FILE"],
            "tiny_model_dir": settings_env["TTS_TINY_MODEL_DIR"],
            "default_model": "chattts-tiny",
        }
    )


@pytest.fixture
def fleet(tmp_path: Path, settings_env: dict[str, str]) -> Iterator[tuple[Flask, redis.Redis, subprocess.Popen[bytes]]]:
    """Start a Redis of its own and three workers through the launcher; yield an API app on it."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    env = {**os.environ, **settings_env, "REDIS_URL": server.url, "TTS_METRICS_PORT": "0",
           "TTS_WORKER_CONCURRENCY": "4", "TTS_DEFAULT_MODEL": "chattts-tiny"}  # fmt: skip
    client = redis.Redis.from_url(server.url)
    try:
        with launched(tmp_path, env, "--fake-devices", "3") as launcher:

            def three_up() -> bool:
                assert launcher.poll() is None, (tmp_path / "launch.log").read_text()[-3000:]
                return bool(client.zcard("tts:workers") >= 3)

            wait_for(three_up, 120, "three workers up", 0.2)
            yield tiny_app(server.url, settings_env), client, launcher
    finally:
        server.stop()


@pytest.mark.slow
def test_load_spreads_over_three_workers_and_a_killed_one_loses_nothing(
    fleet: tuple[Flask, redis.Redis, subprocess.Popen[bytes]],
) -> None:
    app, client, _ = fleet
    api = app.test_client()
    jobs = []
    for i in range(12):
        text = "\n\n".join(f"第{i}号任务的第{k}段话。" for k in range(4))
        response = api.post("/v1/jobs", json={"text": text, "seed": i, "cache": False})
        assert response.status_code == 202, response.get_data(as_text=True)
        jobs.append(response.get_json()["id"])
    workers = [n.decode() for n in client.zrange("tts:workers", 0, -1)]
    wait_for(lambda: all(client.scard(f"tts:held:{name}") for name in workers), 60, "every worker has taken work")
    victim = json.loads(client.get(f"tts:worker:{workers[0]}") or b"{}")
    os.kill(victim["pid"], signal.SIGKILL)  # its segments are handed on; the launcher starts another

    deadline = time.monotonic() + 180
    for job_id in jobs:
        job = wait_for(
            lambda job_id=job_id: (j := api.get(f"/v1/jobs/{job_id}").get_json())["status"] in ("done", "failed") and j,
            max(1.0, deadline - time.monotonic()),
            f"job {job_id} ended",
            0.2,
        )
        assert job["status"] == "done", job
        assert client.hlen(f"tts:job:{{{job_id}}}:audio") == job["segments_total"]
        segment_events = [e for _, e in client.xrange(f"tts:job:{{{job_id}}}:events") if e[b"type"] == b"segment"]
        assert sorted(int(e[b"index"]) for e in segment_events) == list(range(job["segments_total"])), "once each"
    writers = Counter(
        json.loads(meta)["worker"] for job_id in jobs for meta in client.hvals(f"tts:job:{{{job_id}}}:segmeta")
    )
    # All three took work (above); the two that lived wrote, the dead one's segments were made by others.
    assert set(workers[1:]) <= set(writers), f"the surviving workers should have made segments: {writers}"


@pytest.mark.slow
def test_the_one_layout_serves_from_a_single_worker_with_a_model_host_on_each_device(
    tmp_path: Path, settings_env: dict[str, str]
) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    env = {**os.environ, **settings_env, "REDIS_URL": server.url, "TTS_METRICS_PORT": "0",
           "TTS_DEFAULT_MODEL": "chattts-tiny", "TTS_WORKER_LAYOUT": "one", "TTS_TORCH_THREADS": "1"}  # fmt: skip
    env.pop("TTS_MODEL_REPLICAS", None)  # the layout gives one host per device
    client = redis.Redis.from_url(server.url)
    try:
        with launched(tmp_path, env, "--fake-devices", "2") as launcher:

            def both_hosts() -> dict[str, Any] | None:
                assert launcher.poll() is None, (tmp_path / "launch.log").read_text()[-3000:]
                names = [n.decode() for n in client.zrange("tts:workers", 0, -1)]
                beat: dict[str, Any] = json.loads(client.get(f"tts:worker:{names[0]}") or b"{}") if names else {}
                tiny = [h for h in beat.get("pool", []) if h["model"] == "chattts-tiny"]
                return beat if len(tiny) == 2 else None

            beat = wait_for(both_hosts, 120, "one worker with both hosts loaded", 0.2)
            assert beat["device"] == "cpu,cpu"
            hosts = sorted((h["replica"], h["device"]) for h in beat["pool"] if h["model"] == "chattts-tiny")
            assert hosts == [(0, "cpu"), (1, "cpu")]
            api = tiny_app(server.url, settings_env).test_client()
            jobs = [api.post("/v1/jobs", json={"text": f"第{i}号。第二句话。", "seed": i, "cache": False})
                    .get_json()["id"] for i in range(6)]  # fmt: skip
            for job_id in jobs:
                job = wait_for(lambda job_id=job_id: (j := api.get(f"/v1/jobs/{job_id}").get_json())["status"]
                               in ("done", "failed") and j, 120, f"job {job_id} ended", 0.2)  # fmt: skip
                assert job["status"] == "done", job
            assert client.zcard("tts:workers") == 1, "one worker for both devices"
    finally:
        server.stop()
