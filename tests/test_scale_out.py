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
from pathlib import Path

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


@pytest.fixture
def fleet(tmp_path: Path, settings_env: dict[str, str]) -> Iterator[tuple[Flask, redis.Redis, subprocess.Popen[bytes]]]:
    """Start a Redis of its own and three workers through the launcher; yield an API app on it."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    env = {**os.environ, **settings_env, "REDIS_URL": server.url, "TTS_METRICS_PORT": "0",
           "TTS_WORKER_CONCURRENCY": "4", "TTS_DEFAULT_MODEL": "chattts-tiny"}  # fmt: skip
    with (tmp_path / "launch.log").open("ab") as log:
        launcher = subprocess.Popen([sys.executable, "-m", "workers.launch", "--fake-devices", "3"],
                                    cwd=ROOT, env=env, stdout=log, stderr=log)  # fmt: skip
    client = redis.Redis.from_url(server.url)

    def three_up() -> bool:
        assert launcher.poll() is None, (tmp_path / "launch.log").read_text()[-3000:]
        return bool(client.zcard("tts:workers") >= 3)

    wait_for(three_up, 120, "three workers up", 0.2)
    app = create_app(
        {
            "redis_url": server.url,
            "models_file": settings_env["TTS_MODELS_FILE"],
            "tiny_model_dir": settings_env["TTS_TINY_MODEL_DIR"],
            "default_model": "chattts-tiny",
        }
    )
    try:
        yield app, client, launcher
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(60)
        except subprocess.TimeoutExpired:
            launcher.kill()
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
