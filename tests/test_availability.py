"""A model is available only when its files are whole: a missing or corrupt model answers 404 at submission."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask

from api import create_app
from core.registry import ModelSpec
from tests.support.servers import ROOT, RedisServer
from workers.engines import chattts_files
from workers.engines.chattts import ChatTTSEngine
from workers.engines.chattts_assets import ASSET_FILES, DESCRIPTOR_NAME
from workers.engines.chattts_files import _sha256, check_weights
from workers.engines.chattts_random import FORMAT
from workers.engines.errors import EngineLoadError


@pytest.fixture
def model(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """Return a copy of the tiny model that a test may break."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))


def as_real_weights(model: Path) -> dict[str, str]:
    """Take the random-weight descriptor away, so the folder reads as real weights; return its files' hashes."""
    (model / DESCRIPTOR_NAME).unlink()
    return {key: hashlib.sha256((model / rel).read_bytes()).hexdigest() for key, rel in ASSET_FILES.items()}


def test_a_whole_random_weight_model_is_available(model: Path) -> None:
    assert check_weights(model).ok


def test_a_missing_or_empty_folder_is_not_available_and_says_where_weights_go(tmp_path: Path) -> None:
    for folder in (tmp_path / "absent", tmp_path):
        verdict = check_weights(folder)
        assert not verdict.ok
        assert f"{folder}/asset/" in verdict.reason


@pytest.mark.parametrize("rel", sorted(ASSET_FILES.values()))
def test_a_model_missing_any_one_file_is_not_available(model: Path, rel: str) -> None:
    (model / rel).unlink()
    verdict = check_weights(model)
    assert not verdict.ok
    assert f"{rel} is missing" in verdict.reason


@pytest.mark.parametrize("rel", ["asset/gpt/model.safetensors", "asset/Vocos.safetensors"])
def test_a_truncated_weights_file_is_not_available(model: Path, rel: str) -> None:
    path = model / rel
    path.write_bytes(path.read_bytes()[:-100])
    verdict = check_weights(model)
    assert not verdict.ok
    assert rel in verdict.reason and "descriptor records" in verdict.reason


def test_a_truncated_file_of_real_weights_is_caught_by_its_own_header_before_any_hashing(model: Path) -> None:
    as_real_weights(model)
    path = model / "asset" / "Embed.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    verdict = check_weights(model, hashes=False)
    assert not verdict.ok
    assert "its own header says" in verdict.reason


def test_an_empty_or_unparsable_json_file_is_not_available(model: Path) -> None:
    config = model / "asset" / "gpt" / "config.json"
    config.write_bytes(b"")
    assert "is empty" in check_weights(model).reason
    as_real_weights(model)
    config.write_text("{not json", encoding="utf-8")
    assert "cannot be read" in check_weights(model, hashes=False).reason


def test_real_weights_must_match_the_hash_map(model: Path) -> None:
    own = as_real_weights(model)
    assert check_weights(model, real_sha256=own).ok
    verdict = check_weights(model)  # ChatTTS's own map: these are not its weights
    assert not verdict.ok
    assert "SHA-256 map" in verdict.reason
    assert check_weights(model, hashes=False).ok, "the loader leaves the hashes to ChatTTS"


def test_a_file_is_hashed_once_until_it_changes(model: Path) -> None:
    own = as_real_weights(model)
    check_weights(model, real_sha256=own)
    misses = _sha256.cache_info().misses
    assert check_weights(model, real_sha256=own).ok
    assert _sha256.cache_info().misses == misses
    path = model / "asset" / "Decoder.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the same size: only the hash can tell
    path.write_bytes(bytes(data))
    verdict = check_weights(model, real_sha256=own)
    assert not verdict.ok and "Decoder.safetensors" in verdict.reason


def test_a_folder_is_checked_once_while_its_files_are_unchanged_and_again_when_one_changes(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API checks at every submission and the worker at every segment: an unchanged folder costs a stat a file."""
    reads: list[Path] = []
    real_read = chattts_files.read_descriptor
    monkeypatch.setattr(chattts_files, "read_descriptor", lambda root: reads.append(root) or real_read(root))
    assert all(check_weights(model, hashes=False).ok for _ in range(3))
    assert len(reads) == 1
    config = model / "asset" / "gpt" / "config.json"
    kept = config.read_bytes()
    config.unlink()
    assert "config.json is missing" in check_weights(model, hashes=False).reason
    config.write_bytes(kept)
    assert check_weights(model, hashes=False).ok
    assert len(reads) == 3


def _sparse_safetensors(path: Path, elements: int) -> int:
    """Write a safetensors file of one float32 tensor as a sparse file (no disk used); return its size."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [elements], "data_offsets": [0, 4 * elements]}}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + 4 * elements)
    return path.stat().st_size


def test_a_full_size_layout_is_checked_by_size_without_reading_its_gigabyte(tmp_path: Path) -> None:
    """A real-size layout written cheaply: sparse weight files of ChatTTS's real parameter counts."""
    real_params = {"Decoder": 26_000_000, "DVAE": 15_000_000, "Embed": 36_000_000, "Vocos": 14_000_000,
                   "gpt/model": 189_000_000}  # fmt: skip
    sizes = {}
    for key, rel in ASSET_FILES.items():
        path = tmp_path / rel
        stem = rel.removeprefix("asset/").removesuffix(".safetensors")
        if stem in real_params:
            sizes[key] = _sparse_safetensors(path, real_params[stem])
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}", encoding="utf-8")
            sizes[key] = path.stat().st_size
    descriptor = {"format": FORMAT, "random_weights": True, "preset": "full", "bytes": sizes}
    (tmp_path / DESCRIPTOR_NAME).write_text(json.dumps(descriptor), encoding="utf-8")
    assert sum(sizes.values()) > 1_000_000_000
    assert check_weights(tmp_path).ok
    with (tmp_path / "asset" / "gpt" / "model.safetensors").open("r+b") as f:
        f.truncate(sizes["sha256_asset_gpt_model_safetensors"] - 1)
    verdict = check_weights(tmp_path)
    assert not verdict.ok and "gpt/model.safetensors" in verdict.reason


def test_an_engine_without_a_weights_check_needs_only_its_folder(tmp_path: Path) -> None:
    assert ModelSpec(name="e", engine="espeak").available
    assert ModelSpec(name="e", engine="espeak", weights=tmp_path).available
    assert not ModelSpec(name="e", engine="espeak", weights=tmp_path / "absent").available


@pytest.fixture
def broken_app(redis_server: RedisServer, model: Path, tmp_path: Path) -> Iterator[Flask]:
    """Return the API with two broken copies of the tiny model: an empty folder and one truncated file."""
    registry = json.loads((ROOT / "models.json").read_text(encoding="utf-8"))
    tiny = registry["models"]["chattts-tiny"]
    (tmp_path / "empty").mkdir()
    decoder = model / "asset" / "Decoder.safetensors"
    decoder.write_bytes(decoder.read_bytes()[:-1])
    registry["models"]["empty-chattts"] = {**tiny, "weights": str(tmp_path / "empty")}
    registry["models"]["truncated-chattts"] = {**tiny, "weights": str(model)}
    models = tmp_path / "models.json"
    models.write_text(json.dumps(registry), encoding="utf-8")
    app = create_app({"redis_url": redis_server.url, "models_file": models, "default_model": "espeak-en"})
    yield app
    app.extensions["tts"].close()


def test_submitting_to_a_model_with_missing_or_truncated_files_answers_404_saying_why(broken_app: Flask) -> None:
    client = broken_app.test_client()
    for name, why in (("empty-chattts", "/asset/"), ("truncated-chattts", "Decoder.safetensors is ")):
        response = client.post("/v1/jobs", json={"text": "你好。", "model": name})
        assert response.status_code == 404, response.get_data(as_text=True)
        message = response.get_json()["error"]["message"]
        assert "not available" in message and why in message and "make full-model" in message
    listed = {m["id"]: m["available"] for m in client.get("/v1/models").get_json()["data"]}
    assert listed["empty-chattts"] is False and listed["truncated-chattts"] is False
    assert listed["espeak-en"] is True


def test_a_random_weight_model_skips_the_hash_check_and_says_so(model: Path, caplog: pytest.LogCaptureFixture) -> None:
    decoder = model / "asset" / "Decoder.safetensors"
    data = bytearray(decoder.read_bytes())
    data[-1] ^= 0xFF  # random weights have no hash to keep: a changed one loads
    decoder.write_bytes(bytes(data))
    engine = ChatTTSEngine(weights_dir=model, device="cpu")
    with caplog.at_level(logging.WARNING, logger="workers.engines.chattts"):
        engine.load()
    assert any("RANDOM weights" in r.message and "skipped" in r.message for r in caplog.records)
    engine.unload()


def test_a_corrupted_file_of_real_weights_fails_chattts_own_hash_check(model: Path) -> None:
    as_real_weights(model)
    decoder = model / "asset" / "Decoder.safetensors"
    decoder.write_bytes(decoder.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(EngineLoadError, match="SHA-256"):
        ChatTTSEngine(weights_dir=model, device="cpu").load()


def test_a_truncated_model_refuses_to_load_with_the_reason(model: Path) -> None:
    embed = model / "asset" / "Embed.safetensors"
    embed.write_bytes(embed.read_bytes()[:-8])
    with pytest.raises(EngineLoadError, match=r"Embed\.safetensors"):
        ChatTTSEngine(weights_dir=model, device="cpu").load()


def test_whole_files_of_the_wrong_sizes_pass_the_check_and_fail_at_load(model: Path) -> None:
    """What the check promises is whole files, not that they fit: such a model fails in its worker, with a reason."""
    path = model / DESCRIPTOR_NAME
    descriptor = json.loads(path.read_text(encoding="utf-8"))
    descriptor["sizes"]["embed"]["hidden_size"] *= 2
    path.write_text(json.dumps(descriptor), encoding="utf-8")
    assert check_weights(model).ok
    with pytest.raises(EngineLoadError, match="size mismatch"):
        ChatTTSEngine(weights_dir=model, device="cpu").load()


def test_the_model_list_says_which_models_carry_random_weights(app: Flask) -> None:
    models = {m["id"]: m for m in app.test_client().get("/v1/models").get_json()["data"]}
    assert models["chattts-tiny"]["random_weights"] is True
    assert models["chattts-random"]["random_weights"] is True
    assert models["chattts"]["random_weights"] is False and models["espeak-en"]["random_weights"] is False
