"""Redis passwords and TLS come through the URL: every client the service builds takes them from it."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from api import create_app
from api.services import build_services
from cache import keys
from cache.workers import WorkerRegistry
from celery_config import queue_keys
from core.settings import load_settings
from tests.support.processes import wait_for
from tests.support.servers import free_port
from workers.celery_app import create_celery

PASSWORD = "a-long-redis-password-0451"


@pytest.fixture(scope="module")
def guarded_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """Run a redis-server that refuses every client without the password; yield its port."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port, workdir = free_port(), tmp_path_factory.mktemp("guarded-redis")
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", PASSWORD, "--save", "",
               "--dir", str(workdir), "--logfile", str(workdir / "redis.log")]  # fmt: skip
    server = subprocess.Popen(command)

    def answers() -> bool:
        try:
            return bool(redis.Redis(port=port, password=PASSWORD).ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(answers, 10, "the password-guarded redis-server")
        yield port
    finally:
        server.terminate()
        server.wait(10)


def test_a_password_redis_url_carries_a_job_from_the_api_into_the_broker(
    guarded_port: int, settings_env: dict[str, str]
) -> None:
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=guarded_port).set("x", 1)  # the server really wants the password
    url = f"redis://:{PASSWORD}@127.0.0.1:{guarded_port}/2"
    guarded = redis.Redis.from_url(url)
    guarded.flushdb()
    WorkerRegistry(guarded, ttl_s=30).beat("stand-in-worker", {})  # admission needs a live worker
    app = create_app({"redis_url": url, "models_file": Path(settings_env["TTS_MODELS_FILE"]),
                      "tiny_model_dir": Path(settings_env["TTS_TINY_MODEL_DIR"]), "default_model": "espeak-en",
                      "anonymous_per_minute": 1})  # fmt: skip
    try:
        client = app.test_client()
        answer = client.post("/v1/jobs", json={"text": "Behind a password. Still spoken."})
        assert answer.status_code == 202, answer.get_data(as_text=True)
        job = answer.get_json()
        assert guarded.exists(keys.job(job["id"])), "the job store wrote through the password URL"
        queued = sum(int(guarded.llen(key)) for key in queue_keys("realtime"))  # every priority step's list
        assert queued == job["segments_total"], "the broker got one task per segment"
        assert client.get(f"/v1/jobs/{job['id']}").get_json()["status"] == "queued"
        assert client.post("/v1/jobs", json={"text": "Over the quota."}).status_code == 429, "quotas count there too"
    finally:
        app.extensions["tts"].close()
        guarded.flushdb()


def test_a_rediss_url_gives_every_redis_client_tls_its_password_and_its_database() -> None:
    settings = load_settings(redis_url=f"rediss://:{PASSWORD}@redis.example:6380/3", default_model="espeak-en")
    services = build_services(settings)  # nothing connects until used
    try:
        clients = {"job store": services.redis, "sentence cache": services.cache.redis, "event hub": services.hub.redis}
        for name, client in clients.items():
            pool = client.connection_pool
            assert issubclass(pool.connection_class, redis.SSLConnection), name
            params = pool.connection_kwargs
            assert (params["host"], params["port"], params["db"], params["password"]) == (
                "redis.example",
                6380,
                3,
                PASSWORD,
            ), name
            assert params.get("ssl_cert_reqs", "required") in ("required", ssl.CERT_REQUIRED), name
    finally:
        services.close()


def test_a_rediss_broker_url_uses_tls_with_the_password_and_verifies_the_server() -> None:
    settings = load_settings(redis_url=f"rediss://:{PASSWORD}@redis.example:6380/3")
    connection = create_celery(settings).connection_for_write()
    assert connection.transport_cls == "rediss"
    assert (connection.hostname, connection.port, connection.password, connection.virtual_host) == (
        "redis.example",
        6380,
        PASSWORD,
        "3",
    )
    # kombu falls back to ssl_cert_reqs=CERT_NONE for a rediss:// URL given no SSL options: no certificate check.
    assert connection.ssl, "TLS is on"
    options = connection.ssl if isinstance(connection.ssl, dict) else {}
    verify = options.get("ssl_cert_reqs", ssl.CERT_REQUIRED)
    assert verify in (ssl.CERT_REQUIRED, "required"), f"the broker does not verify the server: {connection.ssl}"
