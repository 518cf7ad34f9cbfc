"""Settings are checked at start-up: a bad value stops the service naming it, and the default model is chosen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from flask import Flask

from api import create_app
from core.errors import SettingsInvalid
from tests.support.servers import ROOT, RedisServer

#: Settings the tests' environment may carry that would decide these tests' outcome.
DECIDING = ("TTS_DEFAULT_MODEL", "TTS_CHATTTS_WEIGHTS_DIR", "TTS_BATCH_MAX_SIZE", "TTS_SCHEDULER")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Return monkeypatch, with the settings these tests decide removed from the environment."""
    for name in DECIDING:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def config(redis_server: RedisServer, models_file: Path, tiny_model_dir: Path) -> dict[str, object]:
    """Return the app's settings for the test Redis and registry, the default model left to choose."""
    return {"redis_url": redis_server.url, "models_file": models_file, "tiny_model_dir": tiny_model_dir}


@pytest.mark.parametrize(("variable", "value"), [("TTS_BATCH_MAX_SIZE", "zero"), ("TTS_SCHEDULER", "lifo")])
def test_the_api_refuses_to_start_on_a_bad_setting_and_names_the_variable(
    clean_env: pytest.MonkeyPatch, config: dict[str, object], variable: str, value: str
) -> None:
    clean_env.setenv(variable, value)
    with pytest.raises(SettingsInvalid) as refused:
        create_app(config)
    assert variable in str(refused.value), str(refused.value)


def test_the_worker_exits_non_zero_on_a_bad_setting_and_names_the_variable(redis_server: RedisServer) -> None:
    env = {k: v for k, v in os.environ.items() if k not in DECIDING}
    env.update(REDIS_URL=redis_server.url, TTS_BATCH_MAX_SIZE="zero", TTS_METRICS_PORT="0")
    done = subprocess.run([sys.executable, "-m", "workers"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode != 0
    assert "TTS_BATCH_MAX_SIZE" in done.stdout + done.stderr, (done.stdout + done.stderr)[-2000:]


def _default_model(config: dict[str, object]) -> str:
    app: Flask = create_app(config)
    try:
        default: str = app.test_client().get("/v1/models").get_json()["default"]
        return default
    finally:
        app.extensions["tts"].close()


def test_without_tts_default_model_espeak_cmn_serves_when_chattts_has_no_weights(
    clean_env: pytest.MonkeyPatch, config: dict[str, object], tmp_path: Path
) -> None:
    assert _default_model({**config, "chattts_weights_dir": tmp_path / "absent"}) == "espeak-cmn"


def test_without_tts_default_model_chattts_serves_once_its_weights_are_there(
    clean_env: pytest.MonkeyPatch, config: dict[str, object], tiny_model_dir: Path
) -> None:
    assert _default_model({**config, "chattts_weights_dir": tiny_model_dir}) == "chattts"


def test_tts_default_model_names_the_default_and_an_unknown_one_stops_the_api(
    clean_env: pytest.MonkeyPatch, config: dict[str, object]
) -> None:
    clean_env.setenv("TTS_DEFAULT_MODEL", "espeak-yue")
    assert _default_model(config) == "espeak-yue"
    clean_env.setenv("TTS_DEFAULT_MODEL", "nobody")
    with pytest.raises(ValueError, match="nobody"):
        create_app(config)
